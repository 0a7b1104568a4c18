// Wall-clock times as users read and write them: UTC timestamps and short durations.
//
// Times are Unix seconds (double, UTC). Parsing is strict: a timestamp must carry its zone, so a
// config or a command line never means different instants on different hosts.
#pragma once

#include <string>

namespace berth {

// Seconds since the Unix epoch, from the system clock.
double unix_now();

// "2026-12-03T20:00:00Z", "2026-12-03 20:00Z", "2026-12-03T21:00:00+01:00" → Unix seconds.
// Seconds are optional (with a fraction: ":SS.fff"); the zone ('Z', "UTC" or " UTC" as
// format_utc_minute writes it, or ±HH:MM) is required; every field is exactly its digits. Throws
// berth::Error saying what is wrong and showing the accepted form.
double parse_utc_time(const std::string& text);

// "2026-12-03 20:31 UTC" (minute precision).
std::string format_utc_minute(double unix_s);
// "2026-12-03T20:31:07Z" (second precision, parseable by parse_utc_time).
std::string format_utc_iso(double unix_s);

// Short human duration: "42s", "7m05s", "1h02m", "3d04h"; under a second "0.4s", "0.05s" (under
// 5 ms "0s"). Negative values get a leading '-'.
std::string format_duration(double seconds);

}  // namespace berth
