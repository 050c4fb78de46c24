// In-memory snapshots, the worker's side: copy a rank's VPS state into its shared-memory
// segment (snapshot_segment.h) on a background thread, and read one back.
//
// The state after step s does not change until step s+1's first optimizer update, so the
// copy of snapshot s runs during step s+1's forward and backward; the trainer waits for it
// right before that update (ParallelTrainer::set_before_update) only when it has not
// finished. Each piece of the state is checksummed while it is in cache and then streamed to
// the slot past the caches, so the commit needs no second pass over the payload.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "checkpoint/snapshot_segment.h"
#include "core/tensor.h"
#include "parallel/vps.h"

namespace weft::checkpoint {

// The payload bytes of a rank's state packed back to back (what a slot holds).
int64_t snapshot_payload_bytes(const parallel::RankLayout& layout);
// layout_hash() of a rank's boxes.
uint64_t snapshot_layout_hash(const parallel::RankLayout& layout);

class SnapshotWriter {
 public:
  explicit SnapshotWriter(SnapshotSegment segment);
  ~SnapshotWriter();  // waits for a copy in flight and commits it; logs a failure, never throws
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // Starts copying `tensors` (host, contiguous; views of the live state are fine) into the
  // segment's free slot as the snapshot `meta` (payload_bytes is filled in here). Waits for
  // (and commits) a copy still in flight first. The caller must not change the tensors'
  // bytes until wait() returns. InternalError when they exceed the segment's capacity.
  void start(SnapshotMeta meta, std::vector<core::Tensor> tensors);
  // Blocks until the copy in flight is done and commits it: its meta, or nullopt when none
  // was in flight. Rethrows the copy's failure (nothing is committed then; the previous
  // snapshot stays the segment's latest).
  std::optional<SnapshotMeta> wait();
  bool in_flight() const { return thread_.joinable(); }
  // Seconds the last finished copy took on its thread, and how long wait() blocked for it.
  double last_copy_s() const { return copy_s_; }
  double last_wait_s() const { return wait_s_; }
  const SnapshotSegment& segment() const { return segment_; }
  // The segment's mapping, handed over once no copy is in flight (InternalError while one
  // is): a world's entry reads its rank's own snapshot through it, whose written slots'
  // pages this process has mapped in already (rank_snapshots.h). The writer writes nothing
  // after this.
  SnapshotSegment take_segment();

 private:
  SnapshotSegment segment_;
  std::thread thread_;
  std::exception_ptr error_;
  std::vector<uint32_t> crcs_;
  std::vector<core::Tensor> tensors_;
  double copy_s_ = 0, wait_s_ = 0;
};

// Fresh tensors holding a committed slot's payload: `layout`'s locals (the rank the slot
// was taken of, in the world it was taken in), in order; each block's crc32c is computed on
// the copy of each L2-sized piece right after it is copied, so the slot is read once. IoError naming the segment when the
// slot's layout hash or payload size is not the layout's, when a block's checksum does not
// match (a corrupted snapshot), or when the slot was rewritten while being read.
std::vector<core::Tensor> read_snapshot(const SnapshotSegment& segment,
                                        const SnapshotSegment::View& view,
                                        const parallel::RankLayout& layout);

}  // namespace weft::checkpoint
