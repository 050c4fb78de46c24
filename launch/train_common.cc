// weft train's shared pieces (train_common.h).
#include "launch/train_common.h"

#include <cstdio>

namespace weft::launch {

volatile std::sig_atomic_t g_train_stop = 0;

namespace {
void on_stop_signal(int) { g_train_stop = 1; }
}  // namespace

void catch_stop_signals() {
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

std::string aux_cell(const core::JobSpec& spec, double aux) {
  if (spec.model.arch != "moe-gpt" || spec.model.moe.balance == "loss_free") return {};
  char buf[32];
  std::snprintf(buf, sizeof buf, " | aux %.4f", aux);
  return buf;
}

core::io::StepMetrics step_metrics(const core::StepStats& st, double secs, int64_t world,
                                   int64_t epoch, int64_t data_epoch) {
  core::io::StepMetrics m;
  m.step = st.step;
  m.loss = st.loss;
  m.lr = st.lr;
  m.grad_norm = st.grad_norm;
  m.tokens_per_s = double(st.tokens) / secs;
  m.world = world;
  m.epoch = epoch;
  m.data_epoch = data_epoch;
  return m;
}

bool saved_by_every(const core::JobSpec& spec, int64_t done) {
  return spec.checkpoint.every > 0 && done > 0 && done % spec.checkpoint.every == 0;
}

void print_attempt(const core::JobSpec& spec, const parallel::LaunchEnv& env,
                   const std::string& resume) {
  if (env.restart_count == 0) return;
  std::printf("weft train: restart %d (membership epoch %lld, world %d): %s\n", env.restart_count,
              (long long)env.rdzv_epoch, env.world,
              !resume.empty() ? ("resuming from the latest checkpoint under " + resume).c_str()
              : spec.checkpoint.every > 0
                  ? "no checkpoint saved yet under checkpoint.dir; starting over from step 0"
                  : "checkpoint.every is 0 (no checkpoints): starting over from step 0");
  std::fflush(stdout);
}

}  // namespace weft::launch
