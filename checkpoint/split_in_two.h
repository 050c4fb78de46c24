// Large snapshot reads, checks and copies run on two threads: a survivor that reads two slots
// while its peers read one then uses the core they leave idle, and on a machine with more
// cores the mapping-in of fresh destinations (a page fault's worth per page) runs twice as
// wide. Shared by the slot reads of snapshot_writer.cc and snapshot_views.cc.
//
// The second thread is one helper per process, started at the first split and kept, and the
// work is handed out in pieces that either thread takes: a thread made per call needs a stack
// (an mmap, and page faults), which waits for the process's mmap lock while another thread
// populates memory (base/populate.h). A recovering survivor checks its slot while its prefault
// populates its next layout: the check of its own 403 MiB slot took 263-266 ms, half of it
// done and the rest waiting for the second thread to exist (docs/run.md). Now the caller takes
// every piece the helper has not, so a late or busy helper costs it nothing.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace weft::checkpoint {

// Work at least this large is split; below it a second thread costs more than it saves.
constexpr int64_t kSplitBytes = int64_t(64) << 20;
// The pieces the two threads take turns at (rounded down to the caller's unit).
constexpr int64_t kSplitPieceBytes = int64_t(16) << 20;

// The process's helper thread: runs one call's work at a time.
class SplitHelper {
 public:
  // This process's (a forked child gets its own: its parent's thread is not in it).
  // It lives as long as the process (never destroyed: a split may run at exit).
  static SplitHelper& get();
  // Hands `work` to the helper when it is idle; false when another call's work holds it.
  bool post(const std::function<void()>* work);
  // After the caller's own share of `work` (posted): withdraws it when the helper has not
  // taken it yet, else waits until the helper has finished it.
  void finish(const std::function<void()>* work);

 private:
  SplitHelper();
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* posted_ = nullptr;   // waiting for the helper
  const std::function<void()>* running_ = nullptr;  // taken by the helper
  std::thread thread_;
};

// Runs fn(from, to) over [0, total) in pieces cut at multiples of `unit`, each piece once,
// on the caller and the process's helper thread when the total is at least kSplitBytes and
// the machine has a second core (each thread takes its pieces in increasing order); else
// fn(0, total) once on the caller. `unit` is what one thread must do whole (a checksum
// block).
template <typename Fn>
void split_in_two(int64_t total, int64_t unit, const Fn& fn) {
  if (total < kSplitBytes || unit <= 0 || std::thread::hardware_concurrency() < 2) {
    fn(0, total);
    return;
  }
  const int64_t piece = std::max(unit, kSplitPieceBytes / unit * unit);
  std::atomic<int64_t> next{0};
  const std::function<void()> take = [&] {
    for (int64_t from; (from = next.fetch_add(piece)) < total;) fn(from, std::min(total, from + piece));
  };
  SplitHelper& helper = SplitHelper::get();
  const bool posted = helper.post(&take);
  take();
  if (posted) helper.finish(&take);
}

}  // namespace weft::checkpoint
