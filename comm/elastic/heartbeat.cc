// Heartbeat's thread: set the TTL key, sleep an interval (woken early by stop), repeat.
#include "comm/elastic/heartbeat.h"

#include <exception>

#include "base/log.h"

namespace weft::comm {

Heartbeat::Heartbeat(Store& store, std::string key, Millis interval, Millis ttl,
                     std::string witness_key)
    : store_(store),
      key_(std::move(key)),
      witness_key_(std::move(witness_key)),
      interval_(interval),
      ttl_(ttl),
      bound_(!witness_key_.empty() && store_.binds_to_connection()) {}

Heartbeat::~Heartbeat() { stop(); }

void Heartbeat::beat_once() {
  const Bytes beat = to_bytes(std::to_string(beats_.load() + 1));
  if (bound_) {
    // The witness first: its deadline must not be later than the key's (heartbeat.h).
    store_.set(witness_key_, beat, ttl_);
    store_.set(key_, beat, SetOptions{.ttl = ttl_, .bind = true});
  } else {
    store_.set(key_, beat, ttl_);
  }
  beats_.fetch_add(1);
}

void Heartbeat::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_.load()) return;
  if (thread_.joinable()) thread_.join();  // a finished earlier run
  beat_once();
  failure_.reset();
  stopping_ = false;
  running_ = true;
  thread_ = std::thread([this] { loop(); });
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (wake_.wait_for(lock, interval_, [this] { return stopping_; })) break;
    lock.unlock();
    std::optional<std::string> error;
    try {
      beat_once();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    lock.lock();
    if (error) {
      if (!failure_) WEFT_WARN("elastic", "heartbeat on ", key_, " failed: ", *error);
      failures_.fetch_add(1);
    }
    failure_ = error;
  }
}

void Heartbeat::stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    t = std::move(thread_);
  }
  wake_.notify_all();
  if (t.joinable()) t.join();
  running_ = false;
}

bool Heartbeat::stop_and_erase() {
  stop();
  try {
    store_.erase(key_);
    if (bound_) store_.erase(witness_key_);
    return true;
  } catch (...) {
    return false;
  }
}

std::optional<std::string> Heartbeat::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

}  // namespace weft::comm
