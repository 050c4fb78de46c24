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
