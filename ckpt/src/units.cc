#include "ckpt/units.h"

#include <cctype>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ckpt {

std::string StrFormat(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

namespace {
// Splits "2.5GiB" into the number (2.5, as text) and the suffix ("GiB").
Result<std::pair<long double, std::string>> SplitNumber(std::string_view text,
                                                        std::string_view what) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  s = s.substr(i);
  if (s.empty()) return InvalidArgument(std::string(what) + ": empty value");
  if (s[0] == '-') return InvalidArgument(std::string(what) + " '" + s + "' is negative");
  char* end = nullptr;
  errno = 0;
  long double v = std::strtold(s.c_str(), &end);
  if (end == s.c_str() || errno == ERANGE || !std::isfinite(static_cast<double>(v))) {
    return InvalidArgument(std::string(what) + " '" + s + "' is not a number");
  }
  std::string suffix(end);
  while (!suffix.empty() && std::isspace(static_cast<unsigned char>(suffix.front())))
    suffix.erase(suffix.begin());
  return std::make_pair(v, suffix);
}
}  // namespace

Result<int64_t> ParseCount(std::string_view text) {
  auto split = SplitNumber(text, "count");
  if (!split.ok()) return split.status();
  auto [v, suffix] = *split;
  long double scale = 1;
  if (suffix.empty()) scale = 1;
  else if (suffix == "k" || suffix == "K") scale = 1e3L;
  else if (suffix == "M" || suffix == "m") scale = 1e6L;
  else if (suffix == "B" || suffix == "G" || suffix == "b" || suffix == "g") scale = 1e9L;
  else if (suffix == "T" || suffix == "t") scale = 1e12L;
  else return InvalidArgument("count '" + std::string(text) + "': unknown suffix '" + suffix +
                              "' (use k, M, B/G, T or a plain number like 350e6)");
  long double scaled = v * scale;
  long double rounded = std::nearbyint(scaled);
  if (std::fabs(static_cast<double>(scaled - rounded)) > 1e-6L * std::max<long double>(1, scaled)) {
    return InvalidArgument("count '" + std::string(text) + "' is not a whole number");
  }
  if (rounded > 9.2e18L) return InvalidArgument("count '" + std::string(text) + "' is too large");
  return static_cast<int64_t>(rounded);
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  auto split = SplitNumber(text, "size");
  if (!split.ok()) return split.status();
  auto [v, suffix] = *split;
  std::string u;
  for (char c : suffix) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  long double scale;
  if (u.empty() || u == "B") scale = 1;
  else if (u == "K" || u == "KB") scale = 1e3L;
  else if (u == "M" || u == "MB") scale = 1e6L;
  else if (u == "G" || u == "GB") scale = 1e9L;
  else if (u == "T" || u == "TB") scale = 1e12L;
  else if (u == "KIB") scale = 1024.0L;
  else if (u == "MIB") scale = 1024.0L * 1024;
  else if (u == "GIB") scale = 1024.0L * 1024 * 1024;
  else if (u == "TIB") scale = 1024.0L * 1024 * 1024 * 1024;
  else return InvalidArgument("size '" + std::string(text) + "': unknown unit '" + suffix +
                              "' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  long double bytes = std::nearbyint(v * scale);
  if (bytes > 1.8e19L) return InvalidArgument("size '" + std::string(text) + "' is too large");
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace ckpt
