// Trace consistency, lower bound, text IO, the builder, the recorder and replay.
#include "memory/trace.h"

#include <algorithm>
#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>

#include "base/check.h"

namespace weft::memory {

std::string trace_error(const Trace& t) {
  if (t.num_events < 0) return "negative event count";
  std::vector<uint8_t> used(size_t(t.num_events), 0);
  auto take = [&](int64_t e) {
    if (e < 0 || e >= t.num_events || used[size_t(e)]) return false;
    used[size_t(e)] = 1;
    return true;
  };
  int64_t prev = -1;
  size_t frees = 0;
  for (size_t k = 0; k < t.records.size(); ++k) {
    const TraceRecord& r = t.records[k];
    auto bad = [&](const std::string& what) { return str("record ", k, ": ", what); };
    if (r.alloc_event <= prev) return bad("allocation events are not increasing");
    prev = r.alloc_event;
    if (!take(r.alloc_event))
      return bad(str("allocation event ", r.alloc_event, " out of range or reused"));
    if (r.alloc_span < 0) return bad("negative allocation span");
    if (r.freed()) {
      if (r.free_event <= r.alloc_event) return bad("freed before it was allocated");
      if (!take(r.free_event))
        return bad(str("free event ", r.free_event, " out of range or reused"));
      if (r.free_span < r.alloc_span) return bad("free span before allocation span");
      ++frees;
    } else if (r.free_span != -1) {
      return bad("free span set on a record that is not freed");
    }
  }
  if (size_t(t.num_events) != t.records.size() + frees)
    return str("event count ", t.num_events, " != allocations + frees ", t.records.size() + frees);
  return "";
}

uint64_t peak_live_bytes(const Trace& t, uint64_t alignment) {
  std::vector<int64_t> delta(size_t(t.num_events) + 1, 0);
  for (const TraceRecord& r : t.records) {
    int64_t bytes = int64_t(alignment <= 1 ? r.size : block_size(r.size, alignment));
    delta[size_t(r.alloc_event)] += bytes;
    delta[size_t(t.end_of(r))] -= bytes;
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return uint64_t(peak);
}

// ---- text IO ---------------------------------------------------------------------------

namespace {
constexpr const char* kMagic = "weft-memory-trace";
constexpr const char* kColumns =
    "size,alloc_event,free_event,tag,phase,micro_batch,alloc_span,free_phase,free_micro_batch,"
    "free_span";

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream is(line);
  while (std::getline(is, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

template <typename T>
bool parse_int(const std::string& s, T* out) {
  if (s.empty()) return false;
  size_t pos = 0;
  try {
    long long v = std::stoll(s, &pos);
    if (pos != s.size()) return false;
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) return false;
    }
    *out = T(v);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

void write_trace(const Trace& t, std::ostream& out) {
  out << kMagic << ",1\n"
      << "events," << t.num_events << "\n"
      << kColumns << "\n";
  for (const TraceRecord& r : t.records) {
    out << r.size << ',' << r.alloc_event << ',' << r.free_event << ',' << tag_name(r.tag) << ','
        << phase_name(r.phase) << ',' << r.micro_batch << ',' << r.alloc_span << ','
        << phase_name(r.free_phase) << ',' << r.free_micro_batch << ',' << r.free_span << '\n';
  }
}

Trace read_trace(std::istream& in, const std::string& source) {
  Trace t;
  std::string line;
  int lineno = 0, stage = 0;  // 0: magic, 1: events, 2: columns, 3: rows
  auto fail = [&](const std::string& what) { throw IoError(str(source, ":", lineno, ": ", what)); };
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = split_csv(line);
    if (stage == 0) {
      if (f.size() != 2 || f[0] != kMagic) fail(str("expected '", kMagic, ",1'"));
      if (f[1] != "1") fail("unsupported trace version " + f[1]);
    } else if (stage == 1) {
      if (f.size() != 2 || f[0] != "events" || !parse_int(f[1], &t.num_events) || t.num_events < 0)
        fail("expected 'events,<count>'");
    } else if (stage == 2) {
      if (line != kColumns) fail(str("expected the column header '", kColumns, "'"));
    } else {
      if (f.size() != 10) fail(str("expected 10 fields, got ", f.size()));
      TraceRecord r;
      if (!parse_int(f[0], &r.size)) fail("bad size '" + f[0] + "'");
      if (!parse_int(f[1], &r.alloc_event)) fail("bad alloc_event '" + f[1] + "'");
      if (!parse_int(f[2], &r.free_event)) fail("bad free_event '" + f[2] + "'");
      if (!parse_tag(f[3], &r.tag)) fail("unknown tag '" + f[3] + "'");
      if (!parse_phase(f[4], &r.phase)) fail("unknown phase '" + f[4] + "'");
      if (!parse_int(f[5], &r.micro_batch)) fail("bad micro_batch '" + f[5] + "'");
      if (!parse_int(f[6], &r.alloc_span)) fail("bad alloc_span '" + f[6] + "'");
      if (!parse_phase(f[7], &r.free_phase)) fail("unknown free_phase '" + f[7] + "'");
      if (!parse_int(f[8], &r.free_micro_batch)) fail("bad free_micro_batch '" + f[8] + "'");
      if (!parse_int(f[9], &r.free_span)) fail("bad free_span '" + f[9] + "'");
      if (r.free_event < kNotFreed) fail("bad free_event '" + f[2] + "'");
      t.records.push_back(r);
      continue;
    }
    ++stage;
  }
  if (in.bad()) fail("read error");
  if (stage < 3) fail("truncated header");
  if (std::string err = trace_error(t); !err.empty()) fail("inconsistent trace: " + err);
  return t;
}

void save_trace(const Trace& t, const std::string& path) {
  std::ofstream out(path);
  if (!out) throw IoError("cannot write trace file " + path);
  write_trace(t, out);
  out.flush();
  if (!out) throw IoError("error writing trace file " + path);
}

Trace load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot open trace file " + path);
  return read_trace(in, path);
}

// ---- builder ---------------------------------------------------------------------------

void TraceBuilder::set_phase(Phase phase, int micro_batch) {
  if (span_used_) ++span_;
  span_used_ = false;
  phase_ = phase;
  micro_batch_ = micro_batch;
}

size_t TraceBuilder::alloc(uint64_t size, Tag tag) {
  TraceRecord r;
  r.size = size;
  r.alloc_event = trace_.num_events++;
  r.tag = tag;
  r.phase = phase_;
  r.micro_batch = micro_batch_;
  r.alloc_span = span_;
  span_used_ = true;
  trace_.records.push_back(r);
  return trace_.records.size() - 1;
}

void TraceBuilder::free(size_t record) {
  WEFT_CHECK(record < trace_.records.size(), "free of unknown trace record ", record);
  TraceRecord& r = trace_.records[record];
  WEFT_CHECK(!r.freed(), "trace record ", record, " freed twice");
  r.free_event = trace_.num_events++;
  r.free_phase = phase_;
  r.free_micro_batch = micro_batch_;
  r.free_span = span_;
  span_used_ = true;
}

Trace TraceBuilder::take() {
  Trace out = std::move(trace_);
  clear();
  return out;
}

void TraceBuilder::clear() {
  trace_ = Trace{};
  span_ = 0;
  span_used_ = false;
}

// ---- recorder --------------------------------------------------------------------------

void* TraceRecorder::allocate(size_t bytes, Tag tag) {
  std::lock_guard<std::mutex> lock(mu_);
  void* p = inner_.allocate(bytes, tag);
  live_[p] = Live{builder_.alloc(bytes, tag), step_};
  return p;
}

void TraceRecorder::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  inner_.free(ptr);  // throws for a pointer it does not know, before any state changes here
  if (it == live_.end()) return;  // allocated from `inner` directly: not ours to trace
  if (it->second.step == step_) {
    builder_.free(it->second.record);
  } else {
    ++frees_of_earlier_steps_;
  }
  live_.erase(it);
}

void TraceRecorder::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  builder_.clear();
  ++step_;
  inner_.begin_step();
}

void TraceRecorder::set_phase(Phase phase, int micro_batch) {
  std::lock_guard<std::mutex> lock(mu_);
  builder_.set_phase(phase, micro_batch);
  inner_.set_phase(phase, micro_batch);
}

Trace TraceRecorder::trace() const {
  std::lock_guard<std::mutex> lock(mu_);
  return builder_.trace();
}

size_t TraceRecorder::frees_of_earlier_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frees_of_earlier_steps_;
}

// ---- replay ----------------------------------------------------------------------------

void replay_trace(const Trace& t, Allocator& alloc, const ReplayOptions& opt) {
  if (std::string err = trace_error(t); !err.empty())
    WEFT_CHECK(false, "replay of a bad trace: ", err);
  // event -> record, with the sign telling allocation (+1) from free (-(record + 1)).
  std::vector<int64_t> events(size_t(t.num_events), 0);
  for (size_t k = 0; k < t.records.size(); ++k) {
    events[size_t(t.records[k].alloc_event)] = int64_t(k) + 1;
    if (t.records[k].freed()) events[size_t(t.records[k].free_event)] = -(int64_t(k) + 1);
  }
  std::vector<void*> ptrs(t.records.size(), nullptr);
  alloc.begin_step();
  int32_t span = -1;
  try {
    for (int64_t e : events) {
      bool is_alloc = e > 0;
      size_t k = size_t((is_alloc ? e : -e) - 1);
      const TraceRecord& r = t.records[k];
      int32_t s = is_alloc ? r.alloc_span : r.free_span;
      if (s != span) {
        span = s;
        alloc.set_phase(is_alloc ? r.phase : r.free_phase,
                        is_alloc ? r.micro_batch : r.free_micro_batch);
      }
      if (is_alloc) {
        ptrs[k] = alloc.allocate(r.size, r.tag);
        if (opt.on_alloc) opt.on_alloc(k, ptrs[k], r);
      } else {
        if (opt.on_free) opt.on_free(k, ptrs[k], r);
        void* p = ptrs[k];
        ptrs[k] = nullptr;
        alloc.free(p);
      }
    }
  } catch (...) {
    for (void* p : ptrs)
      if (p) alloc.free(p);
    throw;
  }
  if (!opt.free_unfreed_at_end) return;
  for (size_t k = 0; k < ptrs.size(); ++k) {
    if (!ptrs[k]) continue;
    if (opt.on_free) opt.on_free(k, ptrs[k], t.records[k]);
    alloc.free(ptrs[k]);
  }
}

}  // namespace weft::memory
