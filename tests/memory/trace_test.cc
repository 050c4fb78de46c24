// Trace recording, the text format, the lower bound, replay, and the synthetic step model.
#include "memory/trace.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "base/error.h"
#include "memory/caching_allocator.h"
#include "memory/host_allocator.h"
#include "memory/synthetic_trace.h"
#include "memory_test_util.h"

namespace weft::memory {
namespace {

bool same_records(const Trace& a, const Trace& b) {
  if (a.num_events != b.num_events || a.records.size() != b.records.size()) return false;
  for (size_t k = 0; k < a.records.size(); ++k) {
    const TraceRecord &x = a.records[k], &y = b.records[k];
    if (x.size != y.size || x.alloc_event != y.alloc_event || x.free_event != y.free_event ||
        x.tag != y.tag || x.phase != y.phase || x.micro_batch != y.micro_batch ||
        x.alloc_span != y.alloc_span || x.free_phase != y.free_phase ||
        x.free_micro_batch != y.free_micro_batch || x.free_span != y.free_span)
      return false;
  }
  return true;
}

TEST(TraceRecorder, RecordsSizesEventsTagsPhasesAndSpans) {
  HostAllocator host;
  TraceRecorder rec(host);
  rec.begin_step();
  rec.set_phase(Phase::kForward, 0);
  void* a = rec.allocate(100, Tag::kActivation);  // event 0
  void* w = rec.allocate(7, Tag::kWorkspace);     // event 1
  rec.free(w);                                    // event 2
  rec.set_phase(Phase::kForward, 1);
  void* b = rec.allocate(200, Tag::kActivation);  // event 3
  rec.set_phase(Phase::kBackward, 1);
  rec.free(b);  // event 4
  rec.set_phase(Phase::kBackward, 0);
  rec.free(a);  // event 5
  rec.set_phase(Phase::kOptimizer);
  void* g = rec.allocate(0, Tag::kGradient);  // event 6, never freed in the step
  Trace t = rec.trace();
  EXPECT_EQ(trace_error(t), "");
  ASSERT_EQ(t.records.size(), 4u);
  EXPECT_EQ(t.num_events, 7);
  const TraceRecord& ra = t.records[0];
  EXPECT_EQ(ra.size, 100u);
  EXPECT_EQ(ra.alloc_event, 0);
  EXPECT_EQ(ra.free_event, 5);
  EXPECT_EQ(ra.tag, Tag::kActivation);
  EXPECT_EQ(ra.phase, Phase::kForward);
  EXPECT_EQ(ra.micro_batch, 0);
  EXPECT_EQ(ra.free_phase, Phase::kBackward);
  EXPECT_EQ(ra.free_micro_batch, 0);
  EXPECT_EQ(t.records[1].alloc_span, t.records[1].free_span);  // a temporary
  EXPECT_EQ(t.records[2].micro_batch, 1);
  EXPECT_NE(t.records[2].alloc_span, t.records[0].alloc_span);
  EXPECT_LT(t.records[2].alloc_span, t.records[2].free_span);
  EXPECT_FALSE(t.records[3].freed());
  EXPECT_EQ(t.records[3].free_span, -1);
  EXPECT_EQ(t.records[3].phase, Phase::kOptimizer);
  EXPECT_EQ(peak_live_bytes(t), 300u);  // a + b; a + w was only 107
  // The next step starts a new trace; the block carried over is not part of it.
  rec.begin_step();
  rec.free(g);
  EXPECT_EQ(rec.trace().records.size(), 0u);
  EXPECT_EQ(rec.trace().num_events, 0);
  EXPECT_EQ(rec.frees_of_earlier_steps(), 1u);
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

TEST(TraceRecorder, UnknownFreeThrowsAndRecordsNothing) {
  CachingAllocator inner;
  TraceRecorder rec(inner);
  void* p = rec.allocate(64);
  int local = 0;
  EXPECT_THROW(rec.free(&local), InternalError);
  Trace t = rec.trace();
  EXPECT_EQ(t.num_events, 1);
  EXPECT_EQ(rec.stats().bytes_live, 64u);
  rec.free(p);
  EXPECT_THROW(rec.free(p), InternalError);
  EXPECT_EQ(rec.trace().num_events, 2);
  EXPECT_EQ(rec.name(), "trace+caching");
}

TEST(Trace, PeakLiveBytesIsTheMaximumOfTheLiveSum) {
  TraceBuilder b;
  size_t x = b.alloc(1000), y = b.alloc(10);
  b.free(x);
  size_t z = b.alloc(2000);
  b.free(y);
  b.free(z);
  Trace t = b.take();
  EXPECT_EQ(peak_live_bytes(t), 2010u);
  EXPECT_EQ(peak_live_bytes(t, 512), 2048u + 512u);
  EXPECT_EQ(block_size(0, 512), 512u);
  EXPECT_EQ(block_size(513, 512), 1024u);
}

TEST(Trace, TextRoundTripKeepsEveryField) {
  StepModel m = testing::small_model(Schedule::k1F1B);
  m.experts = 4;
  Trace t = synthesize_step(m, 3);
  // One record left live, so the not-freed encoding is exercised too.
  TraceBuilder b;
  b.set_phase(Phase::kForward, 2);
  b.alloc(5, Tag::kParameter);
  Trace with_live = b.take();
  for (const Trace* tr : {&t, &with_live}) {
    std::stringstream ss;
    write_trace(*tr, ss);
    Trace back = read_trace(ss);
    EXPECT_TRUE(same_records(*tr, back));
  }
}

TEST(Trace, ReaderRejectsBadInputWithTheLine) {
  auto read = [](const std::string& text) {
    std::istringstream in(text);
    return read_trace(in, "t.csv");
  };
  const std::string head =
      "weft-memory-trace,1\nevents,2\nsize,alloc_event,free_event,tag,phase,micro_batch,"
      "alloc_span,free_phase,free_micro_batch,free_span\n";
  EXPECT_EQ(read(head + "# a comment\n64,0,1,comm,forward,0,0,forward,0,0\n").records.size(), 1u);
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    try {
      read(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("not-a-trace,1\n", "t.csv:1");
  expect_error(head + "64,0,1,bogus,forward,0,0,forward,0,0\n", "t.csv:4: unknown tag");
  expect_error(head + "64,0,1,comm,forward,0\n", "expected 10 fields");
  expect_error(head + "-5,0,1,comm,forward,0,0,forward,0,0\n", "bad size");
  expect_error(head + "64,1,0,comm,forward,0,0,forward,0,0\n", "inconsistent");
  expect_error(head + "64,0,-1,comm,forward,0,0,other,-1,-1\n", "inconsistent");  // 1 event only
  expect_error("weft-memory-trace,1\nevents,0\n", "truncated");
  EXPECT_THROW(load_trace("/nonexistent/trace.csv"), IoError);
}

TEST(Trace, ReplayThroughARecorderReproducesTheTrace) {
  Trace t = testing::random_trace(5, 2000, 1 << 16, 3);
  HostAllocator host;
  TraceRecorder rec(host);
  ReplayOptions opt;
  opt.free_unfreed_at_end = false;
  std::vector<void*> left;
  opt.on_alloc = [&](size_t k, void* p, const TraceRecord& r) {
    if (!r.freed()) left.push_back(p);
  };
  replay_trace(t, rec, opt);
  Trace again = rec.trace();
  ASSERT_EQ(again.records.size(), t.records.size());
  for (size_t k = 0; k < t.records.size(); ++k) {
    EXPECT_EQ(again.records[k].size, t.records[k].size);
    EXPECT_EQ(again.records[k].alloc_event, t.records[k].alloc_event);
    EXPECT_EQ(again.records[k].free_event, t.records[k].free_event);
    EXPECT_EQ(again.records[k].tag, t.records[k].tag);
    EXPECT_EQ(again.records[k].phase, t.records[k].phase);
    EXPECT_EQ(again.records[k].micro_batch, t.records[k].micro_batch);
  }
  EXPECT_EQ(left.size(), 3u);
  for (void* p : left) rec.free(p);
  EXPECT_EQ(host.stats().bytes_live, 0u);
}

TEST(Trace, ReplayFreesWhatItAllocatedWhenTheAllocatorFails) {
  HostSegmentSource tiny(4 << 20);
  CachingAllocator a({}, &tiny);
  TraceBuilder b;
  size_t x = b.alloc(1000);
  size_t y = b.alloc(64 << 20);  // cannot be had
  b.free(y);
  b.free(x);
  EXPECT_THROW(replay_trace(b.take(), a), std::bad_alloc);
  EXPECT_EQ(a.stats().bytes_live, 0u);
}

// Each (micro-batch, chunk) runs forward once and backward once, forward first, and the
// stage never holds more forwards than the schedule allows.
void check_schedule(const StepModel& m, int max_in_flight) {
  std::vector<Microstep> s = pipeline_schedule(m);
  std::set<std::pair<int, int>> fwd, bwd;
  int in_flight = 0, peak = 0;
  for (const Microstep& ms : s) {
    auto key = std::make_pair(ms.micro_batch, ms.chunk);
    if (ms.forward) {
      EXPECT_TRUE(fwd.insert(key).second);
      peak = std::max(peak, ++in_flight);
    } else {
      EXPECT_TRUE(fwd.count(key)) << "backward before forward";
      EXPECT_TRUE(bwd.insert(key).second);
      --in_flight;
    }
  }
  EXPECT_EQ(fwd.size(), size_t(m.micro_batches * m.virtual_stages));
  EXPECT_EQ(bwd.size(), fwd.size());
  EXPECT_EQ(peak, max_in_flight);
}

TEST(SyntheticTrace, SchedulesRunEveryMicrostepOnceInOrder) {
  StepModel m = testing::small_model(Schedule::k1F1B);
  check_schedule(m, 4);  // stage 0 of 4 holds 4 forwards
  m.stage = 3;
  check_schedule(m, 1);
  m.stage = 0;
  m.schedule = Schedule::kInterleaved;
  m.virtual_stages = 2;
  check_schedule(m, 11);  // warm-up (4-1)*2 + (2-1)*4 = 10, plus the steady state's one
  m.schedule = Schedule::kSequential;
  m.virtual_stages = 1;
  check_schedule(m, 1);
  m.schedule = Schedule::kInterleaved;
  m.micro_batches = 6;
  EXPECT_THROW(pipeline_schedule(m), ConfigError);
}

TEST(SyntheticTrace, StepsAreConsistentAndMoEStepsVary) {
  for (Schedule s : {Schedule::kSequential, Schedule::k1F1B, Schedule::kInterleaved}) {
    StepModel m = testing::small_model(s);
    if (s == Schedule::kInterleaved) m.virtual_stages = 2;
    for (bool recompute : {false, true}) {
      m.recompute = recompute;
      Trace t = synthesize_step(m);
      EXPECT_EQ(trace_error(t), "");
      for (const TraceRecord& r : t.records) EXPECT_TRUE(r.freed());
      EXPECT_GT(t.records.size(), 100u);
    }
  }
  StepModel moe = testing::small_model(Schedule::k1F1B);
  moe.experts = 8;
  moe.routing_skew = 1.5;
  Trace a = synthesize_step(moe, 1), b = synthesize_step(moe, 2), a2 = synthesize_step(moe, 1);
  EXPECT_TRUE(same_records(a, a2));
  EXPECT_FALSE(same_records(a, b));
  EXPECT_EQ(trace_error(b), "");
  // With 8 routed tokens over 8 experts, even routing gives each expert one token; skewed
  // routing leaves some experts without tokens, and they allocate nothing.
  moe.seq = 4;
  moe.routing_skew = 0;
  size_t even = synthesize_step(moe, 7).records.size();
  moe.routing_skew = 4;
  Trace sparse = synthesize_step(moe, 7);
  EXPECT_LT(sparse.records.size(), even);
  EXPECT_EQ(trace_error(sparse), "");
}

}  // namespace
}  // namespace weft::memory
