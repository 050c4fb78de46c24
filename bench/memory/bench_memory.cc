// bench_memory: replays training-step traces through the caching allocator (PyTorch's
// design) and through the offline plan + planned allocator, and prints one table row each.
//
//   bench_memory                      the synthetic scenarios below
//   bench_memory --trace a.csv ...    traces recorded by TraceRecorder (replayed as is)
//   options: --steps N (default 4), --write-traces DIR, --csv
//
// Synthetic scenarios come from memory/synthetic_trace.h (its header documents the model
// of a transformer step). Step 0's trace is planned; steps 1.. are replayed through both
// allocators. Dense steps repeat exactly; MoE steps draw new routing every step, so the
// plan meets sizes and counts it did not see. Columns:
//   LB        peak live bytes (the lower bound of any allocator), over all steps
//   reserved  peak bytes held from the system (caching: segments; planned: arena +
//             fallback pool), and frag = 1 - LB / reserved for each allocator
//   plan/LB   the offline plan's arena over its own trace's bound
//   ns/op     wall time per allocate or free in the replay of steps 1.. (warm; the
//             fastest of 5 passes); hit: the share of requests served as planned
// A second table counts how the planned allocator served the requests.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/allocator_comparison.h"
#include "memory/synthetic_trace.h"

using namespace weft::memory;

namespace {

struct Scenario {
  std::string name;
  StepModel model;
};

std::vector<Scenario> scenarios() {
  StepModel gpt;  // GPT, C=2048, F=8192, NH=16, T=2048, B=1; pp4 stage 0 holds 6 layers
  gpt.hidden = 2048;
  gpt.ffn = 8192;
  gpt.heads = 16;
  gpt.seq = 2048;
  gpt.layers = 6;
  gpt.stages = 4;
  gpt.micro_batches = 8;
  std::vector<Scenario> out;
  StepModel seq = gpt;  // one process: 24 layers, gradient accumulation over 4 micro-batches
  seq.schedule = Schedule::kSequential;
  seq.stages = 1;
  seq.layers = 24;
  seq.micro_batches = 4;
  out.push_back({"gpt-seq-ga4", seq});
  out.push_back({"gpt-1f1b-pp4", gpt});
  StepModel rc = gpt;
  rc.recompute = true;
  out.push_back({"gpt-1f1b-recompute", rc});
  StepModel vpp = gpt;
  vpp.schedule = Schedule::kInterleaved;
  vpp.virtual_stages = 2;
  out.push_back({"gpt-interleaved-v2", vpp});
  StepModel vrc = vpp;
  vrc.recompute = true;
  out.push_back({"gpt-interleaved-rc", vrc});
  StepModel moe = gpt;  // 8 experts, top-2, expert FFN 4096, dropless
  moe.experts = 8;
  moe.top_k = 2;
  moe.routing_skew = 0.5;
  out.push_back({"moe-1f1b", moe});
  StepModel skew = moe;
  skew.routing_skew = 1.5;
  skew.recompute = true;
  out.push_back({"moe-1f1b-skew-rc", skew});
  return out;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_memory: %s\nusage: bench_memory [--trace FILE]... [--steps N] "
               "[--write-traces DIR] [--csv]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::string write_dir;
  int steps = 4;
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--trace")
      files.push_back(value());
    else if (a == "--steps")
      steps = std::atoi(value().c_str());
    else if (a == "--write-traces")
      write_dir = value();
    else if (a == "--csv")
      csv = true;
    else
      usage(("unknown argument " + a).c_str());
  }
  if (steps < 2) usage("--steps must be at least 2 (one planned, one or more replayed)");
  std::vector<ComparisonRow> rows;
  try {
    if (!files.empty()) {
      for (const std::string& f : files) {
        Trace t = load_trace(f);
        std::string name = f.substr(f.find_last_of('/') + 1);  // npos + 1 == 0: no folder
        rows.push_back(compare_allocators(name, std::vector<Trace>(size_t(steps), t)));
      }
    } else {
      for (const Scenario& s : scenarios()) {
        std::vector<Trace> traces;
        for (int k = 0; k < steps; ++k) traces.push_back(synthesize_step(s.model, uint64_t(k)));
        if (!write_dir.empty()) save_trace(traces[0], write_dir + "/" + s.name + ".csv");
        rows.push_back(compare_allocators(s.name, traces));
      }
    }
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "bench_memory: %s\n", e.what());
    return 1;
  }
  print_comparison(rows, csv);
  if (!csv) print_serving_details(rows);
  return 0;
}
