// CancellableStore: slice the waits, ask between slices.
#include "comm/store/cancellable_store.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"

namespace weft::comm {

CancellableStore::CancellableStore(std::shared_ptr<Store> base,
                                   std::function<std::string()> cancelled, Millis slice)
    : base_(std::move(base)), cancelled_(std::move(cancelled)), slice_(slice) {}

namespace {

// Calls wait_slice(slice) with slices of at most `slice` until it returns, the timeout
// passes (its TimeoutError) or `cancelled` gives a reason (CommError).
template <typename WaitSlice>
auto sliced(Millis timeout, Millis slice, const std::function<std::string()>& cancelled,
            WaitSlice wait_slice) {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    try {
      return wait_slice(std::max(Millis(1), std::min(slice, left)));
    } catch (const TimeoutError&) {
      if (Clock::now() >= until) throw;
    }
    if (std::string why = cancelled(); !why.empty()) throw CommError(why);
  }
}

}  // namespace

void CancellableStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  sliced(timeout, slice_, cancelled_, [&](Millis t) { base_->wait(keys, t); });
}

std::vector<std::string> CancellableStore::wait_gone(const std::vector<std::string>& keys,
                                                     Millis timeout) {
  return sliced(timeout, slice_, cancelled_, [&](Millis t) { return base_->wait_gone(keys, t); });
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
