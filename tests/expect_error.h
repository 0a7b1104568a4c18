// expect_error(fn, {parts...}): runs `fn` and expects a berth::Error whose message contains every
// string in `parts` (a gtest failure names the missing part and shows the message).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/core/check.h"

namespace berth::test {

template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected berth::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

}  // namespace berth::test
