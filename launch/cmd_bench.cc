// `weft bench train`: tokens/s of Weft's trainer against an equivalent PyTorch model on
// the same shapes, threads and BLAS (OpenBLAS 0.3.21 on both sides), measured side by
// side in one run; plus achieved GFLOP/s against this CPU's FMA peak and where the time
// goes. Each measurement runs in its own process so peak RSS is comparable.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>

#include "base/env.h"
#include "base/error.h"
#include "core/cpu/kernels.h"
#include "core/exec/trainer.h"
#include "core/rng.h"
#include "launch/args.h"
#include "launch/bench_checkpoint.h"
#include "launch/bench_comm.h"
#include "launch/bench_elastic.h"
#include "launch/bench_memory_traces.h"
#include "launch/bench_scaling.h"
#include "launch/bench_search.h"
#include "launch/bench_snapshot.h"
#include "launch/bench_store.h"
#include "launch/bench_util.h"
#include "launch/commands.h"
#include "memory/host_allocator.h"

namespace weft::launch {
namespace {

core::JobSpec spec_for(const TrainBenchConfig& c, int threads) {
  core::JobSpec s;
  s.model.arch = c.arch;
  s.model.kv_heads = c.kv_heads;
  s.model.ffn_dim = c.ffn_dim;
  s.model.layers = c.layers;
  s.model.dim = c.dim;
  s.model.heads = c.heads;
  s.model.seq_len = c.seq;
  s.model.vocab = c.vocab;
  s.train.global_batch = s.train.micro_batch = c.batch;
  s.train.threads = threads;
  s.train.lr = 1e-4;
  return s;
}

// Model FLOPs per token for a training step: 6 per parameter (forward + backward) plus
// causal attention's score and value products, 6 * L * T * C (Llama: C = H * hd as well).
double flops_per_token(const core::JobSpec& s, int64_t params) {
  return 6.0 * double(params) + 6.0 * double(s.model.layers * s.model.seq_len * s.model.dim);
}

// The child side: train a few steps and print one JSON line.
int run_worker(const Args& a) {
  const TrainBenchConfig* found = find_train_config(a.get("--config"));
  if (!found)
    throw ConfigError("--config", "unknown config '" + a.get("--config") +
                                      "'; expected one of: " + train_config_names());
  const TrainBenchConfig& c = *found;
  int threads = int(a.get_int("--threads", 1));
  int steps = int(a.get_int("--steps", 5));
  core::JobSpec spec = spec_for(c, threads);
  core::cpu::set_num_threads(threads);
  memory::HostAllocator act;
  core::Trainer trainer(spec, core::DType::kF32, &act);
  core::CounterRng rng(1, 2);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    for (int64_t i = 0; i < n * c.seq; ++i) {
      uint64_t k = uint64_t((s * c.batch + b0) * c.seq + i) * 2;
      x[i] = int32_t(rng.u32(k) % uint32_t(c.vocab));
      y[i] = int32_t(rng.u32(k + 1) % uint32_t(c.vocab));
    }
  };
  trainer.step(batch);  // warm-up: first-touch of every buffer
  trainer.executor().set_profiling(true);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) trainer.step(batch);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double tps = double(steps * c.batch * c.seq) / secs;
  std::map<std::string, double> share = {{"gemm", 0}, {"attention", 0}, {"rest", 0}};
  double total = 0;
  for (const auto& [type, t] : trainer.executor().profile()) {
    total += t;
    bool gemm = type.rfind("linear", 0) == 0 || type.rfind("matmul", 0) == 0;
    const bool attention = type.rfind("attention", 0) == 0 || type.rfind("gqa_attention", 0) == 0;
    share[gemm ? "gemm" : attention ? "attention" : "rest"] += t;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"tokens_per_s\": %.3f, \"peak_rss_mib\": %.1f, \"gflops\": %.3f, \"gemm\": %.4f, "
              "\"attention\": %.4f, \"rest\": %.4f}\n",
              tps, double(ru.ru_maxrss) / 1024.0,
              tps * flops_per_token(spec, trainer.num_parameters()) / 1e9,
              share["gemm"] / total, share["attention"] / total, share["rest"] / total);
  return 0;
}

// Every benchmark a user can name, with its help. comm, scaling, search, store and elastic print
// their own longer help (bench_comm.cc, bench_scaling.cc, bench_search.cc, bench_store_scale.cc,
// bench_elastic.cc); the others' is here.
struct Bench {
  const char* name;
  const char* help;  // nullptr: the benchmark prints its own on --help
};
const Bench kBenches[] = {
    {"train",
     "usage: weft bench train [--configs S,M,LS] [--threads 1,2] [--steps N] [--repeat R]\n"
     "                        [--no-torch] [--python PATH] [--torch-script PATH]\n"
     "  Weft vs PyTorch tokens/s on config S (GPT, 4x256, seq 256, batch 8, vocab 256),\n"
     "  M (GPT-2-124M-like: 12x768, seq 256, batch 4, vocab 50304) and LS (S's Llama twin:\n"
     "  4 query heads sharing 2 KV heads, rotary, RMSNorm, SwiGLU 688, untied head), each\n"
     "  run in its own process; GFLOP/s against this CPU's FMA peak, peak RSS, where the\n"
     "  time goes.\n"
     "  --repeat R   run each side R times, alternating, and keep each side's fastest run\n"
     "               (default 1; for a machine shared with other work)\n"
     "  --no-torch   Weft only (also when python3 cannot import torch)\n"},
    {"memory",
     "usage: weft bench memory [--steps N] [--trace FILE]... [--csv] [--no-model]\n"
     "  caching allocator vs offline plan + planned allocator on traces of real training\n"
     "  steps (gpt-S, moe-S) and of modelled pipeline steps.\n"
     "  --steps N     steps per trace (default 4; step 0 is planned, all are replayed)\n"
     "  --trace FILE  also a trace saved by `WEFT_MEMORY_TRACE=FILE weft train ...`\n"
     "  --no-model    skip the modelled pipeline traces\n"
     "  --csv         the table as CSV\n"},
    {"comm", nullptr},
    {"checkpoint",
     "usage: weft bench checkpoint [--quick] [--dir DIR] [--threads N] [--steps N]\n"
     "                             [--parts reshard,disk,steps]\n"
     "  save/load against raw disk, async vs sync save step time, and a dp4 -> tp2 x dp2\n"
     "  reshard (through Gloo, then through shared memory) against the bytes it moves and\n"
     "  memcpy.\n"
     "  --quick   small models, a few seconds     --dir DIR  scratch folder (default $TMPDIR)\n"},
    {"scaling", nullptr},
    {"search", nullptr},
    {"store", nullptr},
    {"elastic", nullptr},
    {"snapshot",
     "usage: weft bench snapshot [--parts encode,overhead,recovery,node-loss] [--mib N]\n"
     "                           [--configs S,350M] [--ranks N] [--steps N] [--rounds R]\n"
     "                           [--copies N] [--every K] [--set KEY=VALUE]...\n"
     "                           [--warm-checkpoint] [--timeout S] [--dir DIR] [--keep]\n"
     "  in-memory snapshots' costs, each beside its bound measured in the same run, by part:\n"
     "  encode    Reed-Solomon (ISA-L) encode and the rebuild of one lost data fragment for\n"
     "            k=2 m=1 and k=4 m=2, crc32c, memcpy into touched memory (GB/s and the ratio\n"
     "            to memcpy), one thread; target: encode >= 5 GB/s per core\n"
     "  overhead  the same job under weft run with snapshot.every 0 (baseline) and 1, in\n"
     "            alternating rounds, then 2 and the default interval it recommends (the\n"
     "            smallest whose measured cost is under 1% of the step on every config):\n"
     "            per-step time (median metrics step_ms), its ratio to the baseline, what a\n"
     "            snapshot adds (across runs, and within a run: a copy step against its\n"
     "            neighbours, by wall clock and in the workers' CPU time, which decides)\n"
     "            against the copy's own cost (its bytes / memcpy, measured here); targets:\n"
     "            <= 1% at the default interval, <= 1.2x the copy's cost at every 1\n"
     "  recovery  a worker SIGKILLed mid-run (weft run --max-restarts 1, ZeRO-1): the restart\n"
     "            from the node's snapshots (every step) against one from a durable checkpoint\n"
     "            saved right before the kill (page cache dropped), side by side: detect /\n"
     "            restart / restore (communicators, plan, read snapshots, transfer, resume;\n"
     "            or load) / first step, both from the failure known; target: >= 20x faster\n"
     "            (on one node every worker restarts: the survivors' processes are not kept)\n"
     "  node-loss a node lost whole (weft run, worker, snapshot agent SIGKILLed) under ZeRO-3\n"
     "            over 3 nodes on 127.0.0.1: the survivors keep their processes and resume\n"
     "            from snapshots (replica, then EC(2,1): fetch and decode), against the same\n"
     "            job restarted from a checkpoint saved right before the kill (page cache\n"
     "            dropped), side by side, from the failure known (detection on its own) to\n"
     "            ready and to the first step; target: >= 20x faster. The ~350M state is\n"
     "            scaled down to what three nodes' snapshots, replicas and parity fit\n"
     "  --parts P,...   the parts to run (default all four, in that order)\n"
     "  --mib N         MiB per fragment and per copy (default 256; k=4 m=2 holds 6 of them)\n"
     "  --configs C,... the jobs of overhead, recovery, node-loss: S (4 x 256, seq 256, batch 8, "
     "2\n"
     "                  ranks) and/or a parameter count: configs/bench-elastic-350m.yaml scaled\n"
     "                  to it (default S,350M; the big one on 2 ranks when two snapshot slots\n"
     "                  per rank and the workers fit in memory, else 1)\n"
     "  --ranks N       ranks of every job (default per config, above)\n"
     "  --steps N       overhead: counted steps per variant (default 30, after 3 warm-up ones)\n"
     "  --rounds R      overhead: every 0 and 1 alternate in R runs each (default 2)\n"
     "  --copies N      overhead at the default interval K: counted snapshots (default 3)\n"
     "  --every K       overhead: confirm this interval instead of choosing one\n"
     "  --set KEY=VALUE to every job's weft train, last (e.g. a smaller model for a quick run)\n"
     "  --warm-checkpoint  recovery: keep the checkpoint in the page cache\n"
     "  --timeout S     bound on each job (default 3600)\n"
     "  --dir DIR       the jobs' folders: weft run's output stamped on arrival, metrics\n"
     "                  (default: a temporary one, removed after a good run unless --keep)\n"},
};

std::string bench_names() {
  std::string names;
  for (const Bench& b : kBenches) names += std::string(names.empty() ? "" : ", ") + b.name;
  return names;
}

bool wants_help(const std::vector<std::string>& argv) {
  for (const std::string& s : argv)
    if (s == "--help" || s == "-h") return true;
  return false;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::FILE* out = argv.empty() ? stderr : stdout;
    for (const Bench& b : kBenches)
      if (b.help) std::fputs(b.help, out);
    std::fputs(
        "usage: weft bench comm [--quick] [--ranks 2,4] [--backends gloo,mpi] [--sizes B,...]\n"
        "  Gloo/MPI all-reduce and all-gather bus bandwidth vs memcpy; store latency.\n"
        "usage: weft bench scaling [--quick] [--steps N]\n"
        "  config S world 1 vs dp2 tokens/s; each layout's measured vs predicted step time.\n"
        "usage: weft bench search [--quick] [--steps N] [--config FILE] [--world N] [--top K]\n"
        "  the plan search's top candidates (and Megatron-style defaults) trained on real ranks:\n"
        "  predicted vs measured step, both rankings, searched plan / best measured.\n"
        "usage: weft bench store [--clients 1000,10000] [--seconds S] [--load-clients N]\n"
        "  1K and 10K authenticated clients completing a rendezvous (time, vs PyTorch's libuv\n"
        "  TCPStore); set/get/add ops/s under 1K concurrent clients.\n"
        "usage: weft bench elastic --mode restart [--nodes N] [--params P] [--set K=V]...\n"
        "  a node's death to the first step of the new world (~350M parameters, Adam), split\n"
        "  into detect / rendezvous / restart / load / first step: the restart baseline.\n"
        "Run `weft bench NAME --help` for one benchmark's options.\n",
        out);
    return argv.empty() ? 2 : 0;
  }
  const std::string& name = argv[0];
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  // Internal workers the drivers start in child processes.
  if (name == "train-worker") return run_worker(Args(rest, {"--config", "--threads", "--steps"}));
  if (name == "comm-worker" || name == "comm-mpi-worker") return cmd_bench_comm(argv);
  const Bench* bench = nullptr;
  for (const Bench& b : kBenches)
    if (name == b.name) bench = &b;
  if (!bench)
    throw ConfigError("bench", "unknown benchmark '" + name + "'; expected one of: " +
                                   bench_names() + " (`weft bench --help` describes them)");
  if (bench->help && wants_help(rest)) {
    std::fputs(bench->help, stdout);
    return 0;
  }
  if (name == "memory")
    return run_memory_comparison(Args(rest, {"--steps", "--trace"}, {"--csv", "--no-model"}));
  if (name == "comm") return cmd_bench_comm(argv);
  if (name == "checkpoint") return run_checkpoint_bench(rest);
  if (name == "scaling") return run_scaling(argv);
  if (name == "search") return run_search_bench(argv);
  if (name == "store") return run_store_benchmark(rest);
  if (name == "elastic") return run_elastic_bench(rest);
  if (name == "snapshot") return bench_snapshot(rest);
  return run_train_comparison(Args(
      rest, {"--configs", "--threads", "--steps", "--repeat", "--torch-script", "--python"},
      {"--no-torch"}));
}

}  // namespace weft::launch
