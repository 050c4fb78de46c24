// A store that counts how its stoppable waits ended: by a stop (wait_stoppable false,
// wait_gone_stoppable nullopt) or by their timeout (TimeoutError). A test of a waiter's
// shutdown then checks that its waits were stopped, rather than timing how long it took.
#pragma once

#include <atomic>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "base/error.h"

namespace weft::test {

template <class Base>
class StopCountingStore : public Base {
 public:
  using Base::Base;

  bool wait_stoppable(const std::vector<std::string>& keys, comm::Millis timeout,
                      std::stop_token stop) override {
    try {
      const bool all = Base::wait_stoppable(keys, timeout, stop);
      if (!all) stopped.fetch_add(1);
      return all;
    } catch (const TimeoutError&) {
      timed_out.fetch_add(1);
      throw;
    }
  }
  std::optional<std::vector<std::string>> wait_gone_stoppable(const std::vector<std::string>& keys,
                                                              comm::Millis timeout,
                                                              std::stop_token stop) override {
    try {
      auto gone = Base::wait_gone_stoppable(keys, timeout, stop);
      if (!gone) stopped.fetch_add(1);
      return gone;
    } catch (const TimeoutError&) {
      timed_out.fetch_add(1);
      throw;
    }
  }

  std::atomic<int> stopped{0}, timed_out{0};
};

}  // namespace weft::test
