// Helpers for the memory tests: a live-range overlap checker, block patterns, random and
// small synthetic traces.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "memory/synthetic_trace.h"
#include "memory/trace.h"

namespace weft::memory::testing {

// Tracks [ptr, ptr + bytes) of every live block; a new block that overlaps a live one, or
// is misaligned, or a remove of something not live, is a test failure. Thread-safe.
class LiveRangeChecker {
 public:
  bool add(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + std::max<size_t>(bytes, 1);
    if (lo % Allocator::kAlignment != 0) {
      ADD_FAILURE() << "block " << p << " is not aligned to " << Allocator::kAlignment;
      return false;
    }
    auto next = live_.lower_bound(lo);
    if (next != live_.end() && next->first < hi) {
      ADD_FAILURE() << "block [" << lo << ", " << hi << ") overlaps live [" << next->first << ", "
                    << next->second << ")";
      return false;
    }
    if (next != live_.begin() && std::prev(next)->second > lo) {
      ADD_FAILURE() << "block [" << lo << ", " << hi << ") overlaps live ["
                    << std::prev(next)->first << ", " << std::prev(next)->second << ")";
      return false;
    }
    live_.emplace(lo, hi);
    return true;
  }
  bool remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(reinterpret_cast<uintptr_t>(p)) == 1) return true;
    ADD_FAILURE() << "remove of a block that is not live: " << p;
    return false;
  }
  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, uintptr_t> live_;
};

// Fills a block with bytes derived from `key`, so that a block overwritten by another
// shows up when it is verified at its free.
inline uint8_t pattern_byte(uint64_t key, size_t i) {
  return uint8_t((key * 131 + i * 7 + 1) & 0xff);
}
inline void fill_pattern(void* p, size_t bytes, uint64_t key) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i) b[i] = pattern_byte(key, i);
}
inline bool check_pattern(const void* p, size_t bytes, uint64_t key) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i)
    if (b[i] != pattern_byte(key, i)) return false;
  return true;
}

// Replays a trace with the overlap checker and data patterns on every block.
inline void replay_checked(const Trace& t, Allocator& alloc, LiveRangeChecker& checker,
                           uint64_t salt = 0) {
  ReplayOptions opt;
  opt.on_alloc = [&](size_t k, void* p, const TraceRecord& r) {
    checker.add(p, r.size);
    fill_pattern(p, r.size, k ^ salt);
  };
  opt.on_free = [&](size_t k, void* p, const TraceRecord& r) {
    EXPECT_TRUE(check_pattern(p, r.size, k ^ salt)) << "record " << k << " was overwritten";
    checker.remove(p);
  };
  replay_trace(t, alloc, opt);
}

// Four threads (seeds first_seed..first_seed+3) each allocate and free `ops` random blocks
// of 1..max_bytes in stack order, every block checked against every other live one; at the
// end nothing is live.
inline void hammer_from_threads(Allocator& a, LiveRangeChecker& checker, int ops, size_t max_bytes,
                                Tag tag, uint64_t first_seed) {
  auto work = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<void*, size_t>> mine;
    for (int i = 0; i < ops; ++i) {
      if (mine.empty() || rng() % 2) {
        size_t n = 1 + rng() % max_bytes;
        void* p = a.allocate(n, tag);
        checker.add(p, n);
        mine.emplace_back(p, n);
      } else {
        checker.remove(mine.back().first);
        a.free(mine.back().first);
        mine.pop_back();
      }
    }
    for (auto [p, n] : mine) {
      checker.remove(p);
      a.free(p);
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) threads.emplace_back(work, first_seed + t);
  for (auto& t : threads) t.join();
}

// A random step: `n` allocations of log-uniform sizes (a few of 0 bytes), frees of random
// live blocks, new spans now and then; `unfreed` of them stay live at the end.
inline Trace random_trace(uint64_t seed, size_t n, uint64_t max_size = 1 << 20,
                          size_t unfreed = 0) {
  std::mt19937_64 rng(seed);
  TraceBuilder b;
  std::vector<size_t> live;
  std::uniform_real_distribution<double> u(0, 1);
  size_t made = 0;
  int mb = 0;
  while (made < n || live.size() > unfreed) {
    if (u(rng) < 0.02) b.set_phase(Phase(rng() % 4), mb++ % 8);
    bool alloc = made < n && (live.empty() || u(rng) < 0.55);
    if (alloc) {
      uint64_t size = u(rng) < 0.01 ? 0 : uint64_t(std::exp(u(rng) * std::log(double(max_size))));
      live.push_back(b.alloc(size, Tag(rng() % 7)));
      ++made;
    } else {
      size_t i = rng() % live.size();
      b.free(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
  }
  return b.take();
}

// A small transformer stage, so that every byte of every block can be written and checked.
inline StepModel small_model(Schedule schedule) {
  StepModel m;
  m.batch = 1;
  m.seq = 32;
  m.hidden = 64;
  m.heads = 4;
  m.ffn = 256;
  m.vocab = 512;
  m.layers = 4;
  m.stages = 4;
  m.micro_batches = 8;
  m.schedule = schedule;
  m.workspace_bytes = 16 << 10;
  return m;
}

}  // namespace weft::memory::testing
