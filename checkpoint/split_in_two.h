// Large snapshot reads, checks and copies run on two threads: a survivor that reads two slots
// while its peers read one then uses the core they leave idle, and on a machine with more
// cores the mapping-in of fresh destinations (a page fault's worth per page) runs twice as
// wide. Shared by the slot reads of snapshot_writer.cc and snapshot_views.cc.
#pragma once

#include <cstdint>
#include <thread>

namespace weft::checkpoint {

// Work at least this large is split; below it a thread costs more than it saves.
constexpr int64_t kSplitBytes = int64_t(64) << 20;

// Runs fn(from, to) over [0, total) in two pieces cut at a multiple of `unit` (two threads)
// when the total is at least kSplitBytes and the machine has a second core; else once whole.
template <typename Fn>
void split_in_two(int64_t total, int64_t unit, const Fn& fn) {
  const int64_t half = total / 2 / unit * unit;
  if (total >= kSplitBytes && half > 0 && std::thread::hardware_concurrency() > 1) {
    std::thread second([&] { fn(half, total); });
    fn(0, half);
    second.join();
  } else {
    fn(0, total);
  }
}

}  // namespace weft::checkpoint
