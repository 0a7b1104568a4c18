#include "runtime/core/clock.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string_view>

#include "runtime/core/check.h"

namespace berth {
namespace {

// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (Howard Hinnant's algorithm).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

bool leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

std::tm utc_tm(double unix_s) {
  const std::time_t t = static_cast<std::time_t>(std::floor(unix_s));
  std::tm tm{};
  gmtime_r(&t, &tm);
  return tm;
}

}  // namespace

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double parse_utc_time(const std::string& text) {
  constexpr const char* kForm =
      "YYYY-MM-DDTHH:MM[:SS[.fff]] followed by Z (or UTC) or ±HH:MM, e.g. "
      "2026-12-03T20:00:00Z";
  const char* p = text.c_str();
  // Exactly `n` ASCII digits at p (sscanf's %2d would take a sign, a space or one digit).
  auto digits = [&p](int n, int* out) {
    int v = 0;
    for (int k = 0; k < n; ++k, ++p) {
      if (*p < '0' || *p > '9') return false;
      v = 10 * v + (*p - '0');
    }
    *out = v;
    return true;
  };
  auto literal = [&p](char c) { return *p == c ? (++p, true) : false; };
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  if (!digits(4, &y) || !literal('-') || !digits(2, &mo) || !literal('-') || !digits(2, &d) ||
      !(literal('T') || literal(' ')) || !digits(2, &h) || !literal(':') || !digits(2, &mi)) {
    BERTH_FAIL("cannot read the time '{}': expected {}", text, kForm);
  }
  double frac = 0;  // fractional seconds (ISO 8601: ":SS.fff")
  if (literal(':')) {
    if (!digits(2, &s)) BERTH_FAIL("cannot read the seconds of '{}': expected {}", text, kForm);
    if (*p == '.' || *p == ',') {
      double scale = 0.1;
      const char* q = p + 1;
      for (; *q >= '0' && *q <= '9'; ++q, scale /= 10) frac += (*q - '0') * scale;
      if (q == p + 1) {
        BERTH_FAIL("cannot read the fraction of a second in '{}': expected digits after '{}'", text,
                   *p);
      }
      p = q;
    }
  }
  int offset_min = 0;
  const std::string_view rest(p);
  if (rest == "Z" || rest == "z" || rest == "UTC" || rest == " UTC") {  // (berth prints " UTC")
    p += rest.size();
  } else if (*p == '+' || *p == '-') {
    const int sign = *p++ == '-' ? -1 : 1;
    int oh = 0, om = 0;
    if (!digits(2, &oh) || !literal(':') || !digits(2, &om) || oh > 23 || om > 59) {
      BERTH_FAIL("cannot read the zone offset of '{}': expected {}", text, kForm);
    }
    offset_min = sign * (oh * 60 + om);
  } else if (*p == '\0') {
    BERTH_FAIL("the time '{}' has no zone: add Z for UTC or an offset like +01:00 ({})", text,
               kForm);
  }
  if (*p != '\0') BERTH_FAIL("unexpected text after the time in '{}': expected {}", text, kForm);
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 1970 || y > 9999) {
    BERTH_FAIL("'{}' is not a valid date: the year must be 1970..9999, got {}", text, y);
  }
  if (mo < 1 || mo > 12) {
    BERTH_FAIL("'{}' is not a valid date: the month must be 01..12, got {:02d}", text, mo);
  }
  const int dim = kDays[mo - 1] + (mo == 2 && leap(y) ? 1 : 0);
  if (d < 1 || d > dim) {
    BERTH_FAIL("'{}' is not a valid date: {:04d}-{:02d} has days 01..{}, got {:02d}", text, y, mo,
               dim, d);
  }
  if (h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 59) {
    BERTH_FAIL(
        "'{}' is not a valid date and time: {:02d}:{:02d}:{:02d} is not a time of day "
        "(00:00:00..23:59:59)",
        text, h, mi, s);
  }
  const int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
  return static_cast<double>(secs - int64_t{offset_min} * 60) + frac;
}

std::string format_utc_minute(double unix_s) {
  const std::tm tm = utc_tm(unix_s);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string format_utc_iso(double unix_s) {
  const std::tm tm = utc_tm(unix_s);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  const std::string sign = seconds < 0 ? "-" : "";
  const int64_t t = static_cast<int64_t>(std::llround(std::fabs(seconds)));
  char buf[48];
  if (std::fabs(seconds) < 0.95 && std::fabs(seconds) >= 0.005) {
    // under a second: tenths (hundredths below 0.1 s), where "0s" said nothing
    std::snprintf(buf, sizeof buf, std::fabs(seconds) < 0.095 ? "%.2fs" : "%.1fs",
                  std::fabs(seconds));
  } else if (t < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  } else if (t < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  } else if (t < 86400) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(t / 86400),
                  static_cast<long long>(t % 86400 / 3600));
  }
  return sign + buf;
}

}  // namespace berth
