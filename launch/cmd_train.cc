// `weft train`: one worker's training loop: config, data, trainer, a progress line per
// step, validation, metrics JSONL, a loss curve and a summary in the run folder. Launched
// on several processes (weft run, mpirun) it runs the planned multi-rank trainer instead.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <type_traits>

#include "base/env.h"
#include "base/config.h"
#include "base/error.h"
#include "checkpoint/parallel_state.h"
#include "checkpoint/trainer_state.h"
#include "base/log.h"
#include "core/config/job_spec.h"
#if WEFT_HAVE_CUDA
#include "core/cuda/runtime.h"
#include "core/cuda/trainer.h"
#endif
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "core/io/loss_plot.h"
#include "core/io/metrics.h"
#include "launch/elastic_worker.h"
#include "launch/epoch_notice.h"
#include "core/io/safetensors.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/heartbeat.h"
#include "launch/nonfinite_guard.h"
#include "launch/run_folder.h"
#include "launch/train_common.h"
#include "launch/train_ranks.h"
#include "launch/train_report.h"
#include "parallel/launch_env.h"
#include "parallel/trainer.h"
#include "planner/memory_estimate.h"
#include "planner/policy.h"
#include "planner/search.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp = R"(usage: weft train --config FILE.yaml [options]

  --config FILE           the job's YAML file (required)
  --set a.b=value         override a key (repeatable), e.g. --set train.steps=20
  --init-weights W        start from these safetensors weights instead of the seeded init
  --resume DIR            continue from the newest checkpoint under DIR (or that step folder)
  --save-weights W        write the final weights as safetensors
  --metrics M.jsonl       metrics file (default: <train.out_dir>/metrics.jsonl)

Writes into train.out_dir: metrics.jsonl, loss_curve.svg, config.yaml, summary.txt.
Ctrl-C (or SIGTERM) stops cleanly after the current step, saving a final checkpoint when
checkpoint.dir is set. A step whose loss or gradient norm is not finite is never applied:
train.on_nonfinite: stop (default) ends the run with exit 1 naming it, skip drops it and
goes on, up to train.max_skipped in a row.

Several processes: `weft run --standalone --nproc-per-node N -- weft train ...` or
`mpirun -np N weft train ...` train the plan of the parallel: section on N ranks (rank 0
prints and writes; WEFT_COMM_TIMEOUT_MS bounds every wait on a peer, default 60000;
WEFT_MEMORY_GIB refuses a layout whose per-rank peak exceeds it).

Under `weft run --nnodes MIN:MAX` or `--max-restarts K`, elastic.on_change says what a
membership change does: reshard (default) keeps the surviving workers running and moves
their state into the new world live; restart stops every worker and starts it again from
the latest checkpoint under checkpoint.dir (torchrun's way). A world that the fixed degrees
(tp, pp, ep, a fixed dp) do not fit stops the job naming them under elastic.layout: fixed
(default); elastic.layout: auto trains it in the nearest layout that fits and says so.

snapshot.every: K copies every rank's state into the node's snapshot agent (started by
weft run) every K steps (auto: the fewest steps at which a snapshot costs at most 1% of the
step time, measured on the first one); a restarted or resharded job resumes from them when
nobody alive holds the state.
)";

// The single-process loop, for the CPU trainer and (device: cuda) the CUDA trainer: a
// progress line per step, validation, metrics, checkpoints (CPU), the run folder.
template <typename TrainerT>
int train_single(const Args& args, const core::JobSpec& spec, const parallel::LaunchEnv& env,
                 TrainerT& trainer) {
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  if (args.has("--init-weights"))
    trainer.load_weights(core::io::load_safetensors(args.get("--init-weights"), "--init-weights"),
                         "--init-weights");
  std::unique_ptr<checkpoint::TrainerCheckpoints> ckpt;
  const std::string resume = resume_source(spec, env, args.get_or("--resume", ""));
  print_attempt(spec, env, resume);
  if constexpr (std::is_same_v<TrainerT, core::Trainer>)
    ckpt = std::make_unique<checkpoint::TrainerCheckpoints>(spec, trainer, resume);

  namespace fs = std::filesystem;
  std::optional<int64_t> resumed;
  if (continues_run(env, args.has("--resume"))) resumed = trainer.current_step();
  RunFolder folder = choose_run_folder(spec.train.out_dir, args.get_or("--metrics", ""), resumed);
  if (!folder.note.empty()) std::printf("%s\n", folder.note.c_str());
  fs::path out = folder.out;
  const std::string& metrics_path = folder.metrics_path;
  fs::create_directories(out);
  std::ofstream(out / "config.yaml") << core::job_spec_to_yaml(spec);
  std::unique_ptr<core::io::MetricsWriter> metrics_file = open_metrics(folder, resumed);
  core::io::MetricsWriter& metrics = *metrics_file;

  std::printf("weft train (%s): %s, %lld layers, dim %lld, %.2fM parameters, %lld tokens (train) %lld (val)\n",
              spec.device.c_str(), spec.model.arch.c_str(), (long long)spec.model.layers, (long long)spec.model.dim,
              double(trainer.num_parameters()) / 1e6, (long long)data.train_tokens().size(),
              (long long)data.val_tokens().size());
  std::fflush(stdout);

  auto train_batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  catch_stop_signals();
  TrainReport report(spec);
  NonfiniteGuard guard(spec.train);
  auto t_start = std::chrono::steady_clock::now();
  int64_t saved_at = trainer.current_step();  // a resumed run starts from a checkpoint
  while (trainer.current_step() < spec.train.steps && !g_train_stop) {
    auto t0 = std::chrono::steady_clock::now();
    core::StepStats st = trainer.step(train_batch);
    NonfiniteGuard::Verdict verdict = guard.observe(st);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    core::io::StepMetrics m =
        step_metrics(st, secs, env.world, env.rdzv_epoch, data.sampler().epoch(st.step));
    m.extra = {{"step_ms", secs * 1e3}, {"mem_peak_mib", mib(trainer.activation_stats().bytes_live_peak)}};
    if (spec.model.arch == "moe-gpt") m.extra.insert(m.extra.begin(), {"aux_loss", st.aux_loss});
    if (!st.applied) m.extra.push_back({"skipped", 1});
    metrics.write_step(m);
    report.add_step(m);
    // A stopped step never reaches the checkpoint hooks (its state is the last applied
    // step's, but the run is ending as failed). After the step's metrics line: a crash
    // between the two must not leave a checkpoint whose step has no line.
    if (ckpt && verdict != NonfiniteGuard::Verdict::kStop)
      ckpt->after_step();  // checkpoint.every: a durable checkpoint, in the background when async
    if (saved_by_every(spec, trainer.current_step())) saved_at = trainer.current_step();
    if (verdict == NonfiniteGuard::Verdict::kStop) {
      std::fflush(stdout);
      throw Error(guard.stop_message(st, trainer.first_nonfinite_gradient()));
    }
    if (verdict == NonfiniteGuard::Verdict::kSkipped)
      std::printf("%s\n", guard.skipped_line(st).c_str());
    else if (spec.train.log_every > 0 && (st.step % spec.train.log_every == 0 || st.step + 1 == spec.train.steps))
      std::printf("step %5lld/%lld | loss %.4f%s | lr %.2e | grad %.3f | %8.0f tok/s | mem %.1f MiB | %.0f ms\n",
                  (long long)st.step, (long long)spec.train.steps, st.loss,
                  aux_cell(spec, st.aux_loss).c_str(), st.lr, st.grad_norm, m.tokens_per_s,
                  mib(trainer.activation_stats().bytes_live_peak), secs * 1e3);
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
  if (g_train_stop) std::printf("interrupted: stopped cleanly after step %lld\n", (long long)trainer.current_step() - 1);
  if (g_train_stop && ckpt && !spec.checkpoint.dir.empty() && saved_at != trainer.current_step())
    std::printf("interrupted: saved checkpoint %s\n", ckpt->save(true).c_str());

  if (ckpt) ckpt->finish();
  if (args.has("--save-weights")) core::io::save_safetensors(args.get("--save-weights"), trainer.weights());
  core::io::write_loss_curve_svg((out / "loss_curve.svg").string(), core::io::read_metrics(metrics_path));
  std::string summary = report.summary(total, trainer.activation_stats(), spec.memory.allocator);
  std::ofstream(out / "summary.txt") << summary;
  std::fputs(summary.c_str(), stdout);
  std::printf("run folder: %s (metrics.jsonl, loss_curve.svg, summary.txt)\n", out.string().c_str());
  return g_train_stop ? 130 : 0;
}

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  Args args(argv, {"--config", "--set", "--init-weights", "--save-weights", "--metrics", "--resume"}, {"--help"});
  if (args.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  start_agent_heartbeat();  // under weft run: tells the agent this worker is alive
  std::string config = args.required("--config");
  core::JobSpec spec = core::load_job_spec(config, args.all("--set"));
  parallel::LaunchEnv env = parallel::detect_launch_env();
  refuse_unsupported_job_settings(spec, env);
  if (env.rank == 0)
    for (const std::string& note : spec.notes) std::printf("note: %s\n", note.c_str());
  // Every world size goes through the planner's validation, one process too: a layout that
  // needs more ranks is refused naming the launcher, never silently trained as one process.
  // elastic.layout: auto trains a world its degrees do not fit in the nearest layout that does.
  // plan: search (or searched keys left auto): fit_layout trains the best candidate, the same
  // on every rank; rank 0 prints the candidates once.
  if (planner::needs_search(spec) && env.rank == 0)
    std::fputs(planner::search_table(planner::search_plan(spec, env.world), env.world).c_str(), stdout);
  const core::JobSpec fitted = planner::fit_layout(spec, env.world);
  planner::ParallelConfig layout = planner::resolve_parallel(fitted, env.world);
  if (layout.zero > 0 && layout.deg.dp == 1 && env.rank == 0)
    std::printf("note: parallel.zero=%d shards over the data-parallel ranks and there is one "
                "(dp=1): the optimizer state stays whole\n",
                layout.zero);
  if (spec.device == "cuda") {
#if WEFT_HAVE_CUDA
    core::cuda::require_device("device");  // no GPU: exit 2, names `device`
    if (env.world > 1)
      throw NotSupported("device: cuda on several ranks: the multi-rank executor runs on CPU so far");
    if (args.has("--resume")) throw NotSupported("--resume with device: cuda: not yet");
    core::cuda::CudaTrainer trainer(fitted);
    return train_single(args, fitted, env, trainer);
#else
    throw ConfigError("device", "this build has no CUDA (configure found none); use cpu");
#endif
  }
  // WEFT_PLAN_EXECUTOR=1 runs even one rank through the plan executor (the multi-rank code
  // path), so that `weft bench scaling` calibrates on the executor its layouts run on. So
  // does a lone rank of a job that may grow live: its world can change under it.
  const bool may_grow_live = spec.elastic.on_change == "reshard" && env.launcher == "weft run" &&
                             !env_string(kEpochFileVar, "").empty();
  // In-memory snapshots are taken of the plan executor's state (launch/rank_snapshots.h).
  if (env.world > 1 || may_grow_live || spec.snapshot.enabled() ||
      env_int("WEFT_PLAN_EXECUTOR", 0) == 1)
    return train_ranks(args, spec, env);
  core::cpu::set_num_threads(int(spec.train.threads));
  planner::check_fits_memory(fitted, 1, 1);  // before anything is allocated
  core::Trainer trainer(fitted);  // activation arena: memory.allocator (caching | planned)
  return train_single(args, fitted, env, trainer);
}


}  // namespace weft::launch
