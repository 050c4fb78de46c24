// GPT-2 training throughput on one GPU with Weft's CUDA trainer: synthetic tokens, bf16
// compute with f32 masters, N timed steps after a warm-up; prints one line per step and a
// JSON summary (tokens/s, MFU against a given peak) for bench/gpu/check.sh.
//
//   weft_cuda_gpt2_bench [--layers 12 --dim 768 --heads 12 --seq 1024 --vocab 50304]
//                        [--batch 16] [--accum 1] [--steps 30] [--warmup 3]
//                        [--allocator caching|planned] [--peak-tflops 989] [--json FILE]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "base/error.h"
#include "core/cuda/runtime.h"
#include "core/cuda/trainer.h"

using namespace weft;

namespace {

struct Args {
  int64_t layers = 12, dim = 768, heads = 12, seq = 1024, vocab = 50304;
  int64_t batch = 16, accum = 1, steps = 30, warmup = 3;
  std::string allocator = "caching", json;
  double peak_tflops = 989.0;  // H200 SXM, dense bf16
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--layers")
      a.layers = std::stoll(v);
    else if (k == "--dim")
      a.dim = std::stoll(v);
    else if (k == "--heads")
      a.heads = std::stoll(v);
    else if (k == "--seq")
      a.seq = std::stoll(v);
    else if (k == "--vocab")
      a.vocab = std::stoll(v);
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else if (k == "--accum")
      a.accum = std::stoll(v);
    else if (k == "--steps")
      a.steps = std::stoll(v);
    else if (k == "--warmup")
      a.warmup = std::stoll(v);
    else if (k == "--allocator")
      a.allocator = v;
    else if (k == "--peak-tflops")
      a.peak_tflops = std::stod(v);
    else if (k == "--json")
      a.json = v;
    else
      throw ConfigError(k, "unknown flag");
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    core::cuda::require_device("device");
    core::JobSpec s;
    s.model.arch = "gpt";
    s.model.layers = a.layers, s.model.dim = a.dim, s.model.heads = a.heads;
    s.model.seq_len = a.seq, s.model.vocab = a.vocab;
    s.train.micro_batch = a.batch, s.train.global_batch = a.batch * a.accum;
    s.train.steps = a.steps + a.warmup, s.train.lr = 6e-4, s.train.min_lr = 6e-5;
    s.train.warmup_steps = 10, s.train.dtype = "bf16";
    s.memory.allocator = a.allocator;
    s.device = "cuda";
    std::printf("device: %s\n", core::cuda::device_description(0).c_str());
    core::cuda::CudaTrainer trainer(s);
    // FLOPs per token as nanoGPT's estimate_mfu: 6 N (N without the position embedding)
    // + 12 L C T for attention; torch_gpt2.py uses the same formula.
    const double n = double(trainer.num_parameters() - a.seq * a.dim);
    const double flops_per_token = 6.0 * n + 12.0 * double(a.layers * a.dim * a.seq);
    // Synthetic tokens: a fixed pseudo-random stream (no data files on the GPU machine).
    core::BatchFn batch = [&](int64_t step, int64_t first, int64_t count, int32_t* x, int32_t* y) {
      uint64_t st = uint64_t(step * 1000003 + first) * 0x9E3779B97F4A7C15ull + 1;
      for (int64_t i = 0; i < count * a.seq; ++i) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = int32_t((st >> 33) % uint64_t(a.vocab));
        y[i] = int32_t((st >> 13) % uint64_t(a.vocab));
      }
    };
    double timed = 0;
    int64_t tokens = 0;
    double last_loss = 0;
    for (int64_t i = 0; i < a.steps + a.warmup; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      core::StepStats st = trainer.step(batch);  // synchronises at its end
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= a.warmup) {
        timed += sec;
        tokens += st.tokens;
      }
      last_loss = st.loss;
      std::printf("step %3lld | loss %.4f | grad %.3f | %.1f ms | %.0f tok/s%s\n", (long long)i,
                  st.loss, st.grad_norm, sec * 1e3, double(st.tokens) / sec,
                  i < a.warmup ? " (warm-up)" : "");
      std::fflush(stdout);
    }
    const double tps = double(tokens) / timed;
    const double mfu = tps * flops_per_token / (a.peak_tflops * 1e12);
    const auto mem = trainer.activation_stats();
    std::printf("weft: %.0f tokens/s, MFU %.1f%%, %.1f ms/step, activation peak %.0f MiB\n", tps,
                100 * mfu, 1e3 * timed / double(a.steps), double(mem.bytes_live_peak) / 1048576.0);
    if (!a.json.empty()) {
      std::ofstream f(a.json);
      f << "{\"impl\": \"weft\", \"tokens_per_s\": " << tps << ", \"mfu\": " << mfu
        << ", \"ms_per_step\": " << 1e3 * timed / double(a.steps) << ", \"batch\": " << a.batch
        << ", \"accum\": " << a.accum << ", \"seq\": " << a.seq
        << ", \"params\": " << trainer.num_parameters() << ", \"final_loss\": " << last_loss
        << ", \"activation_peak_bytes\": " << mem.bytes_live_peak << "}\n";
    }
    return 0;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
