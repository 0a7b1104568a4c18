// Numbers as a user types them on a command line or in a duration ("1h30m", "75GiB"): plain
// decimal only. std::stod and std::stoll also take what nobody means there (hexadecimal "0x10",
// "inf", "nan", leading blanks, a '+'), and CLI11's own conversion takes 0x / 0o / 0b prefixes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace berth {

// Reads an unsigned decimal number at the start of `text` (digits, an optional fraction, an
// optional exponent: "12", "1.5", ".5", "2e3") into *value; returns how many characters it read,
// or 0 when `text` does not start with one or it is out of the range of a double.
size_t read_decimal(std::string_view text, double* value);

// True when the whole of `text` is a decimal whole number of 64 bits (an optional '-' and digits,
// no leading zero: "010" is octal 8 to strtoll and CLI11) and then sets *value.
bool parse_whole_number(std::string_view text, int64_t* value);

}  // namespace berth
