// Records allocation traces of real training steps (TraceRecorder under the trainer's
// activation arena), then replays them through both allocators.
#include "launch/bench_memory_traces.h"

#include <cstdio>

#include "core/exec/trainer.h"
#include "core/rng.h"
#include "memory/allocator_comparison.h"
#include "memory/caching_allocator.h"
#include "memory/synthetic_trace.h"
#include "memory/trace.h"

namespace weft::launch {
namespace {

// Traces `steps` optimizer steps of `spec` on random tokens (the routing of an MoE model
// changes from step to step as it trains, which the plan has to absorb).
std::vector<memory::Trace> record(const core::JobSpec& spec, int steps) {
  memory::CachingAllocator caching;
  memory::TraceRecorder recorder(caching);
  std::vector<memory::Trace> traces;
  {
    core::Trainer trainer(spec, core::DType::kF32, &recorder);
    core::CounterRng rng(spec.train.seed, 99);
    const int64_t T = spec.model.seq_len, V = spec.model.vocab, B = spec.train.global_batch;
    auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
      for (int64_t i = 0; i < n * T; ++i) {
        uint64_t k = uint64_t((s * B + b0) * T + i);
        x[i] = int32_t(rng.u32(2 * k) % uint32_t(V));
        y[i] = int32_t(rng.u32(2 * k + 1) % uint32_t(V));
      }
    };
    for (int s = 0; s < steps; ++s) {
      recorder.begin_step();
      trainer.step(batch);
      traces.push_back(recorder.trace());
    }
  }
  return traces;
}

core::JobSpec gpt_s() {
  core::JobSpec s;  // config S of `weft bench train`, two micro-batches
  s.model.layers = 4;
  s.model.dim = 256;
  s.model.heads = 4;
  s.model.seq_len = 256;
  s.model.vocab = 256;
  s.train.global_batch = 8;
  s.train.micro_batch = 4;
  return s;
}

core::JobSpec moe_s() {
  core::JobSpec s = gpt_s();
  s.model.arch = "moe-gpt";
  s.model.dim = 128;
  s.model.moe.experts = 8;
  s.model.moe.top_k = 2;
  s.train.lr = 3e-3;  // routing moves visibly within a few steps
  return s;
}

}  // namespace

int run_memory_comparison(const Args& a) {
  int steps = int(a.get_int("--steps", 4));
  bool csv = a.flag("--csv");
  std::vector<memory::ComparisonRow> rows;
  std::printf("weft bench memory: %d steps per trace (step 0 planned, all replayed)\n", steps);
  std::printf("recording real training steps...\n");
  std::fflush(stdout);
  rows.push_back(memory::compare_allocators("gpt-S 1 process", record(gpt_s(), steps)));
  rows.push_back(memory::compare_allocators("moe-S routing", record(moe_s(), steps)));
  if (!a.flag("--no-model")) {
    // Until the multi-rank runtime records its own, pipeline and ZeRO steps come from the
    // documented model of memory/synthetic_trace.h (GPT, C=2048, T=2048, pp4 stage 0).
    memory::StepModel m;
    m.hidden = 2048, m.ffn = 8192, m.heads = 16, m.seq = 2048, m.layers = 6, m.stages = 4;
    memory::StepModel rc = m;
    rc.recompute = true;
    memory::StepModel vpp = m;
    vpp.schedule = memory::Schedule::kInterleaved;
    vpp.virtual_stages = 2;
    for (auto [name, model] : {std::pair{"pp4 1f1b recompute (model)", rc},
                               std::pair{"pp4 interleaved (model)", vpp}}) {
      std::vector<memory::Trace> t;
      for (int k = 0; k < steps; ++k) t.push_back(memory::synthesize_step(model, uint64_t(k)));
      rows.push_back(memory::compare_allocators(name, t));
    }
  }
  // Traces recorded by `WEFT_MEMORY_TRACE=FILE weft train ...` (e.g. one rank of a pipeline
  // with recompute, or of a ZeRO-3 run): step 0 replayed as every step.
  for (const std::string& f : a.all("--trace")) {
    memory::Trace t = memory::load_trace(f);
    rows.push_back(memory::compare_allocators(f.substr(f.find_last_of('/') + 1),
                                              std::vector<memory::Trace>(size_t(steps), t)));
  }
  std::printf("\n");
  memory::print_comparison(rows, csv);
  if (!csv) memory::print_serving_details(rows);
  return 0;
}

}  // namespace weft::launch
