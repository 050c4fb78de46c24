// CancellableStore: slice the waits, ask between slices.
#include "comm/store/cancellable_store.h"

#include "base/error.h"
#include "comm/store/store_util.h"

namespace weft::comm {

CancellableStore::CancellableStore(std::shared_ptr<Store> base,
                                   std::function<std::string()> cancelled, Millis slice)
    : base_(std::move(base)), cancelled_(std::move(cancelled)), slice_(slice) {}

namespace {

// wait_in_slices() that asks `cancelled` between slices and throws CommError with its reason.
template <typename WaitSlice>
auto sliced(Millis timeout, Millis slice, const std::function<std::string()>& cancelled,
            WaitSlice wait_slice) {
  std::string why;
  auto got = wait_in_slices(
      timeout, slice, [&] { return !(why = cancelled()).empty(); }, wait_slice);
  if (!got) throw CommError(why);
  return *std::move(got);
}

}  // namespace

void CancellableStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  sliced(timeout, slice_, cancelled_, [&](Millis t) {
    base_->wait(keys, t);
    return true;
  });
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
