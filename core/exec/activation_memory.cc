// ActivationMemory: caching, or trace-then-plan.
#include "core/exec/activation_memory.h"

#include "base/env.h"
#include "base/log.h"
#include "memory/allocator_segment_source.h"

namespace weft::core {

ActivationMemory::ActivationMemory(const std::string& kind, memory::Allocator* base) : kind_(kind) {
  if (base) source_ = std::make_unique<memory::AllocatorSegmentSource>(*base);
  caching_ = std::make_unique<memory::CachingAllocator>(memory::CachingOptions{}, source_.get());
  // Step 0 always runs through the recorder (a map insert per allocation).
  recorder_ = std::make_unique<memory::TraceRecorder>(*caching_);
  current_ = recorder_.get();
}

ActivationMemory::~ActivationMemory() {
  WEFT_DEBUG("memory", "arena ends: ", caching_->caching_stats().num_segments,
             " caching segments (", caching_->stats().bytes_reserved >> 20, " MiB) back to ",
             source_ ? source_->name() : "the host");
  size_t live = caching_->stats().bytes_live + (planned_ ? planned_->stats().bytes_live : 0);
  if (live == 0) return;
  // The objects stay (their blocks' frees still come to them), but not the memory: each
  // caching segment goes back to its source (the recycler of an online resize, for the next
  // layout's blocks) once its last block is freed, typically when the world drops its sends.
  WEFT_DEBUG("memory", live, " bytes still live at shutdown: keeping the arena's allocators, ",
             "returning each segment as its blocks are freed");
  caching_->release_as_freed();
  (void)source_.release();
  (void)caching_.release();
  (void)recorder_.release();
  (void)planned_.release();
}

void ActivationMemory::begin_step(int64_t step) {
  if (step >= 1 && current_ == recorder_.get()) {
    memory::Trace trace = recorder_->trace();
    std::string path = env_string("WEFT_MEMORY_TRACE", "");
    // Several ranks: "{rank}" in the path becomes the rank (WEFT_RANK, or Open MPI's).
    if (size_t at = path.find("{rank}"); at != std::string::npos)
      path.replace(at, 6, env_string("WEFT_RANK", env_string("OMPI_COMM_WORLD_RANK", "0")));
    if (!path.empty()) {
      memory::save_trace(trace, path);
      WEFT_INFO("memory", "step-0 allocation trace (", trace.records.size(), " allocations) saved to ", path);
    }
    if (kind_ != "planned") {
      current_ = caching_.get();  // blocks from step 0 still return through the recorder
      current_->begin_step();
      return;
    }
    planned_ = std::make_unique<memory::PlannedAllocator>(trace, memory::PlannedOptions{},
                                                          source_.get(), source_.get());
    current_ = planned_.get();
    WEFT_INFO("memory", "planned ", trace.records.size(), " allocations of step 0 into an arena of ",
              planned_->plan().arena_bytes >> 20, " MiB (lower bound ",
              planned_->plan().lower_bound >> 20, " MiB)");
  }
  current_->begin_step();
}

size_t ActivationMemory::plan_arena_bytes() const { return planned_ ? planned_->plan().arena_bytes : 0; }
size_t ActivationMemory::plan_lower_bound() const { return planned_ ? planned_->plan().lower_bound : 0; }

}  // namespace weft::core
