#include "ckpt/json.h"

#include <string>

namespace ckpt {

Result<nlohmann::json> ParseJsonKeeping(std::string_view text, std::string_view source,
                                        const JsonKeyFilter& keep, int max_depth) {
  bool too_deep = false;
  // The callback sees each value's depth before it is stored; refusing an array or object
  // there also drops everything inside it, so nothing deeper than max_depth is ever built.
  // Refusing a key drops its member the same way.
  const nlohmann::json::parser_callback_t limit =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (depth >= max_depth && (event == nlohmann::json::parse_event_t::object_start ||
                                  event == nlohmann::json::parse_event_t::array_start)) {
          too_deep = true;
          return false;
        }
        if (too_deep) return false;
        if (keep && event == nlohmann::json::parse_event_t::key)
          return keep(depth, parsed.get_ref<const std::string&>());
        return true;
      };
  nlohmann::json j = nlohmann::json::parse(text, limit, /*allow_exceptions=*/false);
  if (too_deep)
    return DataLoss(std::string(source) + ": JSON nested deeper than " +
                    std::to_string(max_depth) + " levels; refused");
  if (j.is_discarded()) return DataLoss(std::string(source) + ": not valid JSON");
  return j;
}

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view source, int max_depth) {
  return ParseJsonKeeping(text, source, nullptr, max_depth);
}

}  // namespace ckpt
