// Waiting in a test for what another thread or process does: a bounded poll.
#pragma once

#include <chrono>
#include <thread>

namespace weft::test {

// Bound on any "eventually" loop: a hang guard, never a timing expectation.
inline constexpr std::chrono::seconds kEventually{20};

// Polls `pred` every `every` until it holds or kEventually passed; returns its last value.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds every = std::chrono::milliseconds(5)) {
  const auto until = std::chrono::steady_clock::now() + kEventually;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

}  // namespace weft::test
