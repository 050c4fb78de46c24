// Step traces: what a training step allocates, when, for what and in which phase. The
// recorder captures them from a live allocator; the planner and benchmarks consume them.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"

namespace weft::memory {

inline constexpr int64_t kNotFreed = -1;

// One allocation of a step. Time is the step's event sequence: every allocation and every
// free of a block allocated in the step is one event, numbered from 0.
struct TraceRecord {
  uint64_t size = 0;  // bytes requested
  int64_t alloc_event = 0;
  int64_t free_event = kNotFreed;  // kNotFreed: still live when the step ended
  Tag tag = Tag::kOther;
  Phase phase = Phase::kOther;  // context at allocation
  int32_t micro_batch = -1;
  int32_t alloc_span = 0;            // index of the set_phase() span at allocation
  Phase free_phase = Phase::kOther;  // context at free (kOther / -1 / -1 when not freed)
  int32_t free_micro_batch = -1;
  int32_t free_span = -1;
  bool freed() const { return free_event != kNotFreed; }
};

struct Trace {
  std::vector<TraceRecord> records;  // in allocation order: records[k] is the k-th allocation
  int64_t num_events = 0;            // allocations plus frees
  // End of a record's lifetime in event time: its free event, or num_events if not freed.
  int64_t end_of(const TraceRecord& r) const { return r.freed() ? r.free_event : num_events; }
};

// The bytes a block of `size` occupies at `alignment` (a 0-byte request still takes one
// aligned unit, since every allocation returns a unique pointer).
inline uint64_t block_size(uint64_t size, uint64_t alignment) {
  uint64_t n = size ? size : 1;
  return (n + alignment - 1) / alignment * alignment;
}

// Empty when the trace is consistent: event indices in range and each used once, records
// in allocation order, frees after allocations, spans set exactly for freed records.
std::string trace_error(const Trace& trace);

// The peak over event time of the sum of live bytes: the lower bound of any allocator on
// this trace. alignment 1 counts requested bytes; larger values count block_size().
uint64_t peak_live_bytes(const Trace& trace, uint64_t alignment = 1);

// Text format (CSV with a two-line preamble; '#' lines are comments):
//   weft-memory-trace,1
//   events,<num_events>
//   size,alloc_event,free_event,tag,phase,micro_batch,alloc_span,free_phase,free_micro_batch,free_span
//   2097152,0,41,activation,forward,0,0,backward,0,5
// Readers throw IoError naming the source and line for unreadable or inconsistent input.
void write_trace(const Trace& trace, std::ostream& out);
Trace read_trace(std::istream& in, const std::string& source_name = "<stream>");
void save_trace(const Trace& trace, const std::string& path);
Trace load_trace(const std::string& path);

// Builds a trace event by event: the recorder uses it, and so do synthetic step models
// and tests that write a step by hand. Not thread-safe.
class TraceBuilder {
 public:
  // Opens a new span (see Allocator::set_phase).
  void set_phase(Phase phase, int micro_batch = -1);
  // Records an allocation; returns its record index.
  size_t alloc(uint64_t size, Tag tag = Tag::kOther);
  // Records the free of a record; a second free or an unknown index throws InternalError.
  void free(size_t record);
  const Trace& trace() const { return trace_; }
  Trace take();  // returns the trace and starts an empty one
  void clear();

 private:
  Trace trace_;
  Phase phase_ = Phase::kOther;
  int32_t micro_batch_ = -1;
  int32_t span_ = 0;
  bool span_used_ = false;  // so that set_phase() before any event does not skip span 0
};

// An Allocator decorator that records every allocation of the current step. Requests go
// to `inner` unchanged, so the step runs exactly as it would without the recorder.
// - begin_step() discards the trace and starts a new one; blocks still live from earlier
//   steps are not part of it (their frees are counted in frees_of_earlier_steps()).
// - set_phase() sets the phase and micro-batch stamped on later events.
// - Both, and the counters, are forwarded to `inner`; stats() are inner's.
// Thread-safe; calls into `inner` happen under the recorder's lock, so the recorded order
// is the order in which `inner` saw the requests. `inner` must outlive the recorder.
class TraceRecorder final : public Allocator {
 public:
  explicit TraceRecorder(Allocator& inner) : inner_(inner) {}

  void* allocate(size_t bytes, Tag tag = Tag::kOther) override;
  void free(void* ptr) override;
  AllocatorStats stats() const override { return inner_.stats(); }
  std::string name() const override { return "trace+" + inner_.name(); }
  void begin_step() override;
  void set_phase(Phase phase, int micro_batch = -1) override;

  // A copy of the current step's trace; blocks still live show as not freed.
  Trace trace() const;
  size_t frees_of_earlier_steps() const;

 private:
  struct Live {
    size_t record;
    uint64_t step;
  };
  Allocator& inner_;
  mutable std::mutex mu_;
  TraceBuilder builder_;
  std::unordered_map<void*, Live> live_;
  uint64_t step_ = 0;
  size_t frees_of_earlier_steps_ = 0;
};

// Replays a trace through an allocator: begin_step(), then every allocation and free in
// event order with the trace's phase context. on_alloc / on_free (optional) see each block
// right after allocation and right before its free. Records the trace leaves live are
// freed after the last event when free_unfreed_at_end is set (otherwise they stay live in
// `alloc`, and the caller has lost their pointers). A bad trace throws InternalError
// before anything is allocated. Exceptions from the
// allocator propagate; blocks already allocated are then freed before rethrowing.
struct ReplayOptions {
  bool free_unfreed_at_end = true;
  std::function<void(size_t record, void* ptr, const TraceRecord& r)> on_alloc;
  std::function<void(size_t record, void* ptr, const TraceRecord& r)> on_free;
};
void replay_trace(const Trace& trace, Allocator& alloc, const ReplayOptions& options = {});

}  // namespace weft::memory
