// CancellableStore: slice the waits, ask between slices.
#include "comm/store/cancellable_store.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"

namespace weft::comm {

CancellableStore::CancellableStore(std::shared_ptr<Store> base,
                                   std::function<std::string()> cancelled, Millis slice)
    : base_(std::move(base)), cancelled_(std::move(cancelled)), slice_(slice) {}

void CancellableStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    try {
      base_->wait(keys, std::max(Millis(1), std::min(slice_, left)));
      return;
    } catch (const TimeoutError&) {
      if (Clock::now() >= until) throw;
    }
    if (std::string why = cancelled_(); !why.empty()) throw CommError(why);
  }
}

Bytes CancellableStore::get(const std::string& key) {
  wait({key}, base_->timeout());
  return base_->get(key);
}

std::vector<Bytes> CancellableStore::multi_get(const std::vector<std::string>& keys) {
  wait(keys, base_->timeout());
  return base_->multi_get(keys);
}

}  // namespace weft::comm
