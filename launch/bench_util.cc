// `weft bench train` driver: child processes, PyTorch side, FMA peak and the table; and the
// layout runs `weft bench scaling` and `weft bench search` time.
#include "launch/bench_util.h"

#include <omp.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/io/json.h"
#include "core/io/metrics.h"
#include "launch/calibration.h"

namespace weft::launch {
namespace {

// Runs a command, returns the last line of its stdout that parses as a JSON object.
core::io::JsonValue run_json(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw IoError("cannot run: " + cmd);
  std::string line, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    line = buf;
    if (!line.empty() && line[0] == '{') last = line;
  }
  int rc = ::pclose(p);
  if (rc != 0 || last.empty()) throw IoError("benchmark process failed (" + std::to_string(rc) + "): " + cmd);
  return core::io::parse_json(last, cmd);
}

double num(const core::io::JsonValue& v, const char* key) {
  const core::io::JsonValue* m = v.find(key);
  return m ? m->number : 0.0;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// S and M are GPTs (tied head, LayerNorm, GELU); LS is S's Llama twin: same layers, width,
// heads, sequence, batch and vocabulary, with 2 KV heads serving the 4 query heads, SwiGLU at
// Llama's width for 256 (688) and an untied head (3.03M parameters against S's 3.29M).
const TrainBenchConfig kTrainConfigs[] = {
    {"S", "gpt", 4, 256, 4, 256, 8, 256, 0, 0},
    {"M", "gpt", 12, 768, 12, 256, 4, 50304, 0, 0},
    {"LS", "llama", 4, 256, 4, 256, 8, 256, 2, 688},
};

// The PyTorch script's flags for config c.
std::string torch_shape(const TrainBenchConfig& c) {
  std::string s = "--arch " + std::string(c.arch) + " --layers " + std::to_string(c.layers) +
                  " --dim " + std::to_string(c.dim) + " --heads " + std::to_string(c.heads) +
                  " --vocab " + std::to_string(c.vocab) + " --seq " + std::to_string(c.seq) +
                  " --batch " + std::to_string(c.batch);
  if (std::string(c.arch) == "llama")
    s += " --kv-heads " + std::to_string(c.kv_heads) + " --ffn-dim " + std::to_string(c.ffn_dim);
  return s;
}

}  // namespace

const TrainBenchConfig* find_train_config(const std::string& name) {
  for (const TrainBenchConfig& c : kTrainConfigs)
    if (name == c.name) return &c;
  return nullptr;
}

std::string train_config_names() {
  std::string names;
  for (const TrainBenchConfig& c : kTrainConfigs)
    names += std::string(names.empty() ? "" : ", ") + c.name;
  return names;
}

double fma_peak_gflops(int threads) {
  // 8 independent accumulator chains of 16 floats: enough to hide FMA latency; -O3
  // -march=native vectorises them to the widest FMA units the CPU has. Each thread times
  // its own loop (about 8 GFLOP, so thread start-up does not count) and the slowest sets
  // the rate.
  constexpr int kChains = 8, kWidth = 16;
  const int64_t iters = 4'000'000'000 / (kChains * kWidth);
  double slowest = 0;
#pragma omp parallel num_threads(threads) reduction(max : slowest)
  {
    float acc[kChains][kWidth], mul[kWidth], add[kWidth];
    for (int w = 0; w < kWidth; ++w) {
      mul[w] = 0.999999f;
      add[w] = 1e-7f * float(w + omp_get_thread_num());
      for (int c = 0; c < kChains; ++c) acc[c][w] = float(c + w);
    }
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i)
      for (int c = 0; c < kChains; ++c)
#pragma omp simd
        for (int w = 0; w < kWidth; ++w) acc[c][w] = acc[c][w] * mul[w] + add[w];
    slowest = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    float sink = 0;
    for (int c = 0; c < kChains; ++c)
      for (int w = 0; w < kWidth; ++w) sink += acc[c][w];
    if (sink == 42.0f) std::printf(" ");  // keep the loop alive
  }
  return 2.0 * double(iters) * kChains * kWidth * threads / slowest / 1e9;
}

int run_train_comparison(const Args& a) {
  std::vector<std::string> configs = split_list(a.get_or("--configs", "S,M,LS"));
  for (const std::string& cfg : configs)
    if (!find_train_config(cfg))
      throw ConfigError("--configs",
                        "unknown config '" + cfg + "'; expected one of: " + train_config_names());
  std::vector<std::string> threads = split_list(a.get_or("--threads", "1,2"));
  std::string steps = std::to_string(a.get_int("--steps", 5));
  const int64_t repeat = a.get_int("--repeat", 1);
  if (repeat < 1 || repeat > 100)
    throw ConfigError("--repeat", "expected an integer in [1, 100], got " + std::to_string(repeat));
  std::string python = a.get_or("--python", "/usr/bin/python3");
  std::string script = a.get_or("--torch-script", std::string(WEFT_SOURCE_DIR) +
                                                      "/bench/train_throughput/torch_gpt.py");
  const bool no_torch = a.flag("--no-torch");
  bool torch =
      !no_torch && std::system((python + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("weft bench train: %s steps after 1 warm-up, OPENBLAS_CORETYPE=%s on both sides",
              steps.c_str(), coretype ? coretype : "(unset)");
  if (repeat > 1)
    std::printf("; each side the best of %lld runs, alternating", static_cast<long long>(repeat));
  std::printf("\n");
  if (no_torch)
    std::printf("(--no-torch: Weft only)\n");
  else if (!torch)
    std::printf("(PyTorch not found at %s: install Debian's python3-torch for the comparison)\n",
                python.c_str());

  std::printf("\n%-3s %3s | %11s %11s %6s | %8s %6s | %9s %9s | %5s %5s %5s\n", "cfg", "thr",
              "weft tok/s", "torch tok/s", "ratio", "GFLOP/s", "%peak", "weft MiB", "torch MiB",
              "gemm", "attn", "rest");
  for (const std::string& cfg : configs) {
    for (const std::string& thr : threads) {
      // popen runs /bin/sh, so resolve our own binary first.
      std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
      // With --repeat, the two sides alternate and each keeps its fastest run: on a shared
      // machine another process's burst slows one run (at 2 threads, several-fold), never
      // speeds one up.
      core::io::JsonValue w;
      double ttps = 0, trss = 0;
      for (int64_t r = 0; r < repeat; ++r) {
        core::io::JsonValue wr = run_json(self + " bench train-worker --config " + cfg +
                                          " --threads " + thr + " --steps " + steps);
        if (r == 0 || num(wr, "tokens_per_s") > num(w, "tokens_per_s")) w = wr;
        if (torch) {
          core::io::JsonValue t = run_json("OMP_NUM_THREADS=" + thr + " " + python + " " + script +
                                           " " + torch_shape(*find_train_config(cfg)) +
                                           " --threads " + thr + " --steps " + steps);
          if (num(t, "tokens_per_s") > ttps) {
            ttps = num(t, "tokens_per_s");
            trss = num(t, "peak_rss_mib");
          }
        }
      }
      double peak = fma_peak_gflops(std::stoi(thr));
      double wtps = num(w, "tokens_per_s");
      std::printf("%-3s %3s | %11.0f %11.0f %6.2f | %8.1f %5.1f%% | %9.0f %9.0f | %4.0f%% %4.0f%% %4.0f%%\n",
                  cfg.c_str(), thr.c_str(), wtps, ttps, ttps > 0 ? wtps / ttps : 0.0,
                  num(w, "gflops"), 100.0 * num(w, "gflops") / peak, num(w, "peak_rss_mib"), trss,
                  100 * num(w, "gemm"), 100 * num(w, "attention"), 100 * num(w, "rest"));
      std::fflush(stdout);
    }
  }
  std::printf(
      "\nratio = weft / torch tokens/s; %%peak = model GFLOP/s over this CPU's FMA peak at "
      "that thread count; gemm/attn/rest = share of Weft's kernel time.\n"
      "S, M: GPT; LS: Llama with S's shapes (4 heads on 2 KV heads, rotary, RMSNorm, SwiGLU "
      "688, untied head), PyTorch side with K/V repeat_interleave'd per group.\n");
  return 0;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

double memcpy_bytes_per_second(size_t bytes, int tries) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < tries; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    src[size_t(i)] = dst[bytes - 1 - size_t(i)];  // keeps the copies observable
  }
  return double(bytes) / best;
}

double quartile1(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 4];
}

std::vector<std::string> short_run_sets(int steps, const std::string& out) {
  return {"train.steps=" + std::to_string(steps), "train.warmup_steps=1", "train.eval_every=0",
          "train.log_every=1000000", "train.threads=1", "train.out_dir=" + out};
}

LayoutTimes run_layout(const std::string& config, const std::vector<std::string>& sets, int world,
                       int steps, const std::string& tag) {
  const double nan = std::nan("");
  LayoutTimes r{nan, nan, nan, nan, nan, "", ""};
  std::string tmpl = "/tmp/weft-" + tag + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    r.error = "cannot create a temporary folder " + tmpl;
    return r;
  }
  const std::string dir = tmpl;
  // WEFT_PLAN_EXECUTOR: world 1 runs the plan executor too, so that the world-1 rows pay
  // the per-instruction costs the layouts pay (and weft calibrate's op_overhead measures).
  std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 WEFT_PLAN_EXECUTOR=1 " +
                    shell_quote(self_exe()) + " run --standalone --nproc-per-node " +
                    std::to_string(world) + " -- weft train --config " + shell_quote(config);
  std::vector<std::string> all = sets;
  for (const std::string& s : short_run_sets(steps, dir + "/run")) all.push_back(s);
  for (const std::string& s : all) cmd += " --set " + shell_quote(s);
  cmd += " >" + shell_quote(dir + "/log") + " 2>&1";
  // std::system waits for `weft run`, which reaps its workers before it exits.
  const int status = std::system(cmd.c_str());
  const bool ok = status == 0;
  const std::string failed = "the run failed (exit " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                             "); log kept in " + dir + "/log";
  try {
    std::vector<double> ms, tps, cms, wms;
    int64_t last = -1;
    if (std::filesystem::exists(dir + "/run/metrics.jsonl"))
      for (const core::io::MetricsRow& m : core::io::read_metrics(dir + "/run/metrics.jsonl")) {
        if (m.is_validation() || !m.has("step_ms")) continue;
        last = std::max(last, int64_t(m.at("step")));
        if (m.at("step") < 1) continue;
        ms.push_back(m.at("step_ms"));
        tps.push_back(m.at("tokens_per_s"));
        if (m.has("compute_ms")) cms.push_back(m.at("compute_ms"));
        if (m.has("comm_ms")) wms.push_back(m.at("comm_ms"));
      }
    // A rank that crashes while shutting down, after every step was written, does not make
    // the timings wrong: keep them and say so (the log stays for whoever fixes the crash).
    if (!ok && last + 1 < steps) throw IoError(failed);
    if (ms.empty()) throw IoError("no step after the first in " + dir + "/run/metrics.jsonl");
    r.q1_ms = quartile1(ms);
    r.median_ms = median(ms);
    r.tokens_per_s = median(tps);
    r.compute_ms = quartile1(cms);
    r.comm_ms = quartile1(wms);
    auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? std::nan("") : sum / double(v.size());
    };
    r.mean_ms = mean(ms);
    r.compute_mean_ms = mean(cms);
    r.comm_mean_ms = mean(wms);
    if (ok)
      std::filesystem::remove_all(dir);
    else
      r.warning = "after its last step, " + failed;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace weft::launch
