// ActivationMemory: caching, or trace-then-plan.
#include "core/exec/activation_memory.h"

#include "base/log.h"

namespace weft::core {

ActivationMemory::ActivationMemory(const std::string& kind) : kind_(kind) {
  caching_ = std::make_unique<memory::CachingAllocator>();
  if (kind_ == "planned") {
    recorder_ = std::make_unique<memory::TraceRecorder>(*caching_);
    current_ = recorder_.get();
  } else {
    current_ = caching_.get();
  }
}

void ActivationMemory::begin_step(int64_t step) {
  if (recorder_ && !planned_ && step >= 1) {
    memory::Trace trace = recorder_->trace();
    planned_ = std::make_unique<memory::PlannedAllocator>(trace);
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
