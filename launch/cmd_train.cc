// `weft train`: one worker's training loop: config, data, trainer, a progress line per
// step, validation, metrics JSONL, a loss curve and a summary in the run folder.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/log.h"
#include "core/config/job_spec.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "core/io/loss_plot.h"
#include "core/io/metrics.h"
#include "core/io/safetensors.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/train_report.h"

namespace weft::launch {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_sigint(int) { g_stop = 1; }

constexpr const char* kHelp = R"(usage: weft train --config FILE.yaml [options]

  --config FILE           the job's YAML file (required)
  --set a.b=value         override a key (repeatable), e.g. --set train.steps=20
  --init-weights W        start from these safetensors weights instead of the seeded init
  --save-weights W        write the final weights as safetensors
  --metrics M.jsonl       metrics file (default: <train.out_dir>/metrics.jsonl)

Writes into train.out_dir: metrics.jsonl, loss_curve.svg, config.yaml, summary.txt.
Ctrl-C stops cleanly after the current step.
)";

double mib(size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  Args args(argv, {"--config", "--set", "--init-weights", "--save-weights", "--metrics"}, {"--help"});
  if (args.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  std::string config = args.required("--config");
  core::JobSpec spec = core::load_job_spec(config, args.all("--set"));
  if (spec.device != "cpu")
    throw ConfigError("device", "'" + spec.device + "' is not available in this build's trainer yet; use cpu");
  core::cpu::set_num_threads(int(spec.train.threads));

  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  core::Trainer trainer(spec);  // activation arena: memory.allocator (caching | planned)
  if (args.has("--init-weights"))
    trainer.load_weights(core::io::load_safetensors(args.get("--init-weights"), "--init-weights"),
                         "--init-weights");

  namespace fs = std::filesystem;
  fs::path out = spec.train.out_dir;
  fs::create_directories(out);
  std::ofstream(out / "config.yaml") << core::job_spec_to_yaml(spec);
  std::string metrics_path = args.has("--metrics") ? args.get("--metrics") : (out / "metrics.jsonl").string();
  core::io::MetricsWriter metrics(metrics_path);

  std::printf("weft train: %s, %lld layers, dim %lld, %.2fM parameters, %lld tokens (train) %lld (val)\n",
              spec.model.arch.c_str(), (long long)spec.model.layers, (long long)spec.model.dim,
              double(trainer.num_parameters()) / 1e6, (long long)data.train_tokens().size(),
              (long long)data.val_tokens().size());
  std::fflush(stdout);

  auto train_batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  std::signal(SIGINT, on_sigint);
  TrainReport report(spec);
  auto t_start = std::chrono::steady_clock::now();
  while (trainer.current_step() < spec.train.steps && !g_stop) {
    auto t0 = std::chrono::steady_clock::now();
    core::StepStats st = trainer.step(train_batch);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    core::io::StepMetrics m;
    m.step = st.step;
    m.loss = st.loss;
    m.lr = st.lr;
    m.grad_norm = st.grad_norm;
    m.tokens_per_s = double(st.tokens) / secs;
    m.epoch = data.sampler().epoch(st.step);
    m.extra = {{"step_ms", secs * 1e3}, {"mem_peak_mib", mib(trainer.activation_stats().bytes_live_peak)}};
    if (spec.model.arch == "moe-gpt") m.extra.insert(m.extra.begin(), {"aux_loss", st.aux_loss});
    metrics.write_step(m);
    report.add_step(m);
    if (spec.train.log_every > 0 && (st.step % spec.train.log_every == 0 || st.step + 1 == spec.train.steps))
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | grad %.3f | %8.0f tok/s | mem %.1f MiB | %.0f ms\n",
                  (long long)st.step, (long long)spec.train.steps, st.loss, st.lr, st.grad_norm,
                  m.tokens_per_s, mib(trainer.activation_stats().bytes_live_peak), secs * 1e3);
    bool last = trainer.current_step() == spec.train.steps;
    if (data.has_val() && spec.train.eval_every > 0 &&
        (trainer.current_step() % spec.train.eval_every == 0 || last)) {
      auto val_batch = [&](int64_t, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
        data.fill_val((b0 / spec.train.global_batch), b0 % spec.train.global_batch, n, x, y);
      };
      int64_t mbs = data.num_val_batches() * (spec.train.global_batch / spec.train.micro_batch);
      double val = trainer.evaluate(val_batch, mbs);
      metrics.write_validation(st.step, val);
      report.add_validation(st.step, val);
      std::printf("step %5lld/%lld | val_loss %.4f\n", (long long)st.step, (long long)spec.train.steps, val);
    }
    std::fflush(stdout);
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (g_stop) std::printf("interrupted: stopped cleanly after step %lld\n", (long long)trainer.current_step() - 1);

  if (args.has("--save-weights")) core::io::save_safetensors(args.get("--save-weights"), trainer.weights());
  core::io::write_loss_curve_svg((out / "loss_curve.svg").string(), core::io::read_metrics(metrics_path));
  std::string summary = report.summary(total, trainer.activation_stats(), spec.memory.allocator);
  std::ofstream(out / "summary.txt") << summary;
  std::fputs(summary.c_str(), stdout);
  std::printf("run folder: %s (metrics.jsonl, loss_curve.svg, summary.txt)\n", out.string().c_str());
  return g_stop ? 130 : 0;
}

}  // namespace weft::launch
