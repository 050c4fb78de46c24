// The activation arena of a trainer, chosen by `memory.allocator`:
//   caching  the baseline: a PyTorch-style caching allocator;
//   planned  STWeaver-style: step 0 runs on the caching allocator while a TraceRecorder
//            records every allocation; from step 1 on a PlannedAllocator serves the step
//            from the offline plan of that trace (online best-fit for what it did not
//            foresee, e.g. MoE routing changes).
// Either way step 0 is traced; WEFT_MEMORY_TRACE=FILE saves that trace (the format of
// memory/trace.h) so `weft bench memory --trace FILE` can replay a real training step;
// "{rank}" in FILE is replaced by the rank when several processes train.
#pragma once

#include <memory>
#include <string>

#include "memory/caching_allocator.h"
#include "memory/planned_allocator.h"
#include "memory/trace.h"

namespace weft::core {

class ActivationMemory {
 public:
  // `kind` is "caching" or "planned" (validated by the config). `base`, when given, serves
  // the arena's big segments (memory::AllocatorSegmentSource): a memory::RecyclingAllocator
  // there keeps their pages when this arena goes, for the next trainer of the process to take
  // (an online resize), instead of unmapping them. It must outlive this object.
  explicit ActivationMemory(const std::string& kind, memory::Allocator* base = nullptr);
  // Blocks may still be live at destruction (a send in flight holds its buffer until the
  // communicator drops it, and communicators can outlive the trainer): the allocators are
  // then left alive (leaked) instead of freed under those blocks, and the caching one returns
  // each of its segments as soon as its last block is freed (a planned arena stays).
  ~ActivationMemory();
  ActivationMemory(const ActivationMemory&) = delete;
  ActivationMemory& operator=(const ActivationMemory&) = delete;
  // The allocator for the current step. Changes only inside begin_step().
  memory::Allocator& current() { return *current_; }
  // Called before every step: switches to the plan after the traced step 0.
  void begin_step(int64_t step);
  // Statistics of the allocator now serving (the plan's once it exists).
  memory::AllocatorStats stats() const { return current_->stats(); }
  const std::string& kind() const { return kind_; }
  // The offline plan's arena and lower bound (0 before the plan exists).
  size_t plan_arena_bytes() const;
  size_t plan_lower_bound() const;

 private:
  std::string kind_;
  // Where the allocators' segments come from (null: the host source). Before them, so that
  // it outlives them.
  std::unique_ptr<memory::SegmentSource> source_;
  // Declared first so they outlive blocks that later allocators' owners still hold.
  std::unique_ptr<memory::CachingAllocator> caching_;
  std::unique_ptr<memory::TraceRecorder> recorder_;
  std::unique_ptr<memory::PlannedAllocator> planned_;
  memory::Allocator* current_ = nullptr;
};

}  // namespace weft::core
