#include "runtime/core/decimal.h"

#include <charconv>
#include <system_error>

namespace berth {
namespace {

size_t digits_at(std::string_view text, size_t i) {
  size_t n = 0;
  while (i + n < text.size() && text[i + n] >= '0' && text[i + n] <= '9') ++n;
  return n;
}

}  // namespace

size_t read_decimal(std::string_view text, double* value) {
  size_t i = digits_at(text, 0);
  size_t mantissa_digits = i;
  if (i < text.size() && text[i] == '.') {
    const size_t fraction = digits_at(text, i + 1);
    mantissa_digits += fraction;
    i += 1 + fraction;
  }
  if (mantissa_digits == 0) return 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    size_t j = i + 1;
    if (j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
    const size_t exponent = digits_at(text, j);
    if (exponent > 0) i = j + exponent;  // "2e" is 2 followed by something else
  }
  const auto [end, err] = std::from_chars(text.data(), text.data() + i, *value);
  if (err != std::errc() || end != text.data() + i) return 0;
  return i;
}

bool parse_whole_number(std::string_view text, int64_t* value) {
  const size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
  if (text.size() == sign || digits_at(text, sign) != text.size() - sign) return false;
  // No leading zero: CLI11 converts what a validator passed with strtoll(…, 0), which reads
  // "010" as octal 8.
  if (text.size() - sign > 1 && text[sign] == '0') return false;
  int64_t v = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (err != std::errc() || end != text.data() + text.size()) return false;
  *value = v;
  return true;
}

}  // namespace berth
