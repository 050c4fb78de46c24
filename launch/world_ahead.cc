// Worlds built ahead of a change known in advance (see world_ahead.h).
#include "launch/world_ahead.h"

#include <algorithm>

#include "base/error.h"
#include "base/check.h"
#include "launch/epoch_notice.h"

namespace weft::launch {

WorldAhead::~WorldAhead() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& b : builds_) b->cancelled->store(true);
  for (auto& b : builds_)
    if (b->thread.joinable()) b->thread.join();
}

void WorldAhead::drop_finished_before(int64_t epoch) {
  for (auto it = builds_.begin(); it != builds_.end();) {
    if ((*it)->epoch < epoch && (*it)->done.load()) {
      (*it)->thread.join();
      it = builds_.erase(it);
    } else {
      ++it;
    }
  }
}

void WorldAhead::start(const parallel::LaunchEnv& env, const std::string& notices,
                       comm::Millis timeout) {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t epoch = env.rdzv_epoch;
  drop_finished_before(epoch);
  for (const auto& b : builds_)
    if (b->epoch >= epoch) return;
  auto b = std::make_unique<Build>();
  b->epoch = epoch;
  Build* raw = b.get();
  raw->thread = std::thread([raw, env, notices, timeout] {
    // Its own watch (one thread per EpochWatch), from the epoch it builds.
    auto superseded = [watch = EpochWatch(notices, env.rdzv_epoch), cancelled = raw->cancelled] {
      if (cancelled->load()) return std::string("the worker is ending");
      std::optional<EpochNotice> n = watch.newer();
      return n ? str("epoch ", watch.epoch(), " was replaced by epoch ", n->epoch,
                     " before its world formed")
               : std::string();
    };
    try {
      raw->world = std::make_unique<parallel::WorkerWorld>(env, timeout, superseded);
    } catch (...) {
      raw->error = std::current_exception();
    }
    raw->done.store(true);
  });
  builds_.push_back(std::move(b));
}

std::unique_ptr<parallel::WorkerWorld> WorldAhead::take(int64_t epoch) {
  std::unique_ptr<Build> mine;
  {
    std::lock_guard<std::mutex> l(mu_);
    drop_finished_before(epoch);
    auto it = std::find_if(builds_.begin(), builds_.end(),
                           [&](const auto& b) { return b->epoch == epoch; });
    if (it == builds_.end()) return nullptr;
    mine = std::move(*it);
    builds_.erase(it);
  }
  mine->thread.join();
  if (mine->error) std::rethrow_exception(mine->error);
  return std::move(mine->world);
}

}  // namespace weft::launch
