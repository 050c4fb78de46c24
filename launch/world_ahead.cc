// Worlds built ahead of a change known in advance (see world_ahead.h).
#include "launch/world_ahead.h"

#include <algorithm>

#include "base/check.h"
#include "base/error.h"
#include "launch/epoch_notice.h"

namespace weft::launch {

WorldAhead::WorldAhead() : builder_([this] { build_loop(); }) {}

WorldAhead::~WorldAhead() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    for (auto& b : builds_) b->cancelled->store(true);
  }
  cv_.notify_all();
  if (builder_.joinable()) builder_.join();
}

void WorldAhead::build(Build& b) {
  // Its own watch (one thread per EpochWatch), from the epoch it builds.
  auto superseded = [watch = EpochWatch(b.notices, b.epoch), cancelled = b.cancelled] {
    if (cancelled->load()) return std::string("the worker is ending");
    std::optional<EpochNotice> n = watch.newer();
    return n ? str("epoch ", watch.epoch(), " was replaced by epoch ", n->epoch,
                   " before its world formed")
             : std::string();
  };
  try {
    b.world = std::make_unique<EpochWorld>(
        connect_epoch_world(b.env, b.trainers, b.timeout, superseded, b.connections));
  } catch (...) {
    b.error = std::current_exception();
  }
}

void WorldAhead::build_loop() {
  for (;;) {
    std::shared_ptr<Build> b;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !pending_.empty(); });
      if (stopping_) return;
      b = pending_.front();
      pending_.erase(pending_.begin());
    }
    build(*b);
    {
      std::lock_guard<std::mutex> l(mu_);
      b->done = true;
    }
    cv_.notify_all();
  }
}

void WorldAhead::start(const parallel::LaunchEnv& env, const std::string& notices,
                       comm::Millis timeout, int connections, EpochTrainers trainers) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return;
    const int64_t epoch = env.rdzv_epoch;
    std::erase_if(builds_, [&](const auto& b) { return b->epoch < epoch && b->done; });
    for (const auto& b : builds_)
      if (b->epoch >= epoch) return;
    auto b = std::make_shared<Build>();
    b->epoch = epoch;
    b->env = env;
    b->notices = notices;
    b->timeout = timeout;
    b->connections = connections;
    b->trainers = std::move(trainers);
    builds_.push_back(b);
    pending_.push_back(std::move(b));
  }
  cv_.notify_all();
}

std::unique_ptr<EpochWorld> WorldAhead::take(int64_t epoch) {
  std::unique_lock<std::mutex> l(mu_);
  std::erase_if(builds_, [&](const auto& b) { return b->epoch < epoch && b->done; });
  auto it = std::find_if(builds_.begin(), builds_.end(),
                         [&](const auto& b) { return b->epoch == epoch; });
  if (it == builds_.end()) return nullptr;
  std::shared_ptr<Build> mine = *it;
  builds_.erase(it);
  cv_.wait(l, [&] { return mine->done; });
  l.unlock();
  if (mine->error) std::rethrow_exception(mine->error);
  return std::move(mine->world);
}

}  // namespace weft::launch
