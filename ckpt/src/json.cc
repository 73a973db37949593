#include "ckpt/json.h"

#include <string>
#include <string_view>

namespace ckpt {

namespace {

// Decodes one UTF-8 sequence at s[i]; its length, or 0 when the bytes there are not valid
// UTF-8 (overlong forms, surrogates and code points above U+10FFFF included).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = c >= 0xC2 && c <= 0xDF   ? 2
             : c >= 0xE0 && c <= 0xEF ? 3
             : c >= 0xF0 && c <= 0xF4 ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
  }
  if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
  if (c == 0xED && b(1) >= 0xA0) return 0;  // UTF-16 surrogate
  if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
  if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
  return n;
}

void AppendJsonString(std::string_view s, std::string& out) {
  static const char kHex[] = "0123456789abcdef";
  const auto escape = [&](const char* prefix, unsigned char v) {
    out += prefix;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  };
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {  // not UTF-8: the byte as a lone low surrogate
      escape("\\udc", c);
      ++i;
      continue;
    }
    if (n == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) {  // C1: U+0080-9F
      escape("\\u00", static_cast<unsigned char>(s[i + 1]));
      i += 2;
      continue;
    }
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          escape("\\u00", c);
        else
          out += static_cast<char>(c);
    }
  }
  out += '"';
}

void AppendJson(const nlohmann::json& j, int indent, int depth, std::string& out) {
  const bool lines = indent >= 0;
  const std::string pad(lines ? static_cast<size_t>(indent * (depth + 1)) : 0, ' ');
  const std::string close_pad(lines ? static_cast<size_t>(indent * depth) : 0, ' ');
  const char* open_sep = lines ? "\n" : "";
  const char* item_sep = lines ? ",\n" : ",";
  if (j.is_object() || j.is_array()) {
    const bool object = j.is_object();
    if (j.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    out += object ? "{" : "[";
    out += open_sep;
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += item_sep;
      first = false;
      out += pad;
      if (object) {
        AppendJsonString(it.key(), out);
        out += lines ? ": " : ":";
      }
      AppendJson(it.value(), indent, depth + 1, out);
    }
    out += open_sep;
    out += close_pad;
    out += object ? "}" : "]";
  } else if (j.is_string()) {
    AppendJsonString(j.get_ref<const std::string&>(), out);
  } else {
    out += j.dump();
  }
}

}  // namespace

std::string JsonText(const nlohmann::json& j, int indent) {
  std::string out;
  AppendJson(j, indent, 0, out);
  return out;
}

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
