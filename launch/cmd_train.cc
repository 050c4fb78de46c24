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
#include "core/io/safetensors.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/heartbeat.h"
#include "launch/nonfinite_guard.h"
#include "launch/run_folder.h"
#include "launch/train_report.h"
#include "parallel/launch_env.h"
#include "parallel/trainer.h"
#include "planner/memory_estimate.h"
#include "planner/policy.h"

namespace weft::launch {
namespace {

// The progress line's balance cell: MoE models with a balance loss show it (loss_free has
// none to show).
std::string aux_cell(const core::JobSpec& spec, double aux) {
  if (spec.model.arch != "moe-gpt" || spec.model.moe.balance == "loss_free") return {};
  char buf[32];
  std::snprintf(buf, sizeof buf, " | aux %.4f", aux);
  return buf;
}

volatile std::sig_atomic_t g_stop = 0;
void on_sigint(int) { g_stop = 1; }

// Ctrl-C and SIGTERM (what schedulers send before they kill) both stop after the current
// step, with a final checkpoint.
void catch_stop_signals() {
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
}

// Whether checkpoint.every saved at `done` steps (TrainerCheckpoints::after_step's rule).
bool saved_by_every(const core::JobSpec& spec, int64_t done) {
  return spec.checkpoint.every > 0 && done > 0 && done % spec.checkpoint.every == 0;
}

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
)";

// weft run starts every rank on this node (standalone); mpirun says how many it placed here.
int ranks_on_node(const parallel::LaunchEnv& env) {
  return int(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env.world));
}

double mib(size_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// Under weft run after a restart: which attempt this is and where it picks the job up.
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

// The multi-rank loop: every rank trains its part of the plan; rank 0 prints the progress
// line, writes the metrics, the weights and the run folder, and validates. Numbers equal the
// single process's (tests/parallel).
int train_ranks(const Args& args, const core::JobSpec& spec, const parallel::LaunchEnv& env) {
  // `weft run` prefixes every line of its workers with [rank r]; mpirun and srun do not.
  if (env.launcher != "weft run") log_set_rank(env.rank);
  const bool lead = env.rank == 0;
  planner::resolve_parallel(spec, env.world);  // bad degrees fail here, before any rank connects
  // A job that cannot fit fails here on every rank alike, before anything is allocated.
  planner::check_fits_memory(spec, env.world, ranks_on_node(env));
  core::cpu::set_num_threads(int(spec.train.threads));
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  parallel::WorkerWorld world(env, comm::Millis(env_int("WEFT_COMM_TIMEOUT_MS", 60'000)));
  // checkpoint.every and --resume: each rank saves and loads its own VPS boxes (collective).
  // A restarted attempt (weft run) resumes from checkpoint.dir's latest checkpoint, which
  // sets every parameter: seeding them first would be work thrown away.
  const std::string resume = resume_source(spec, env, args.get_or("--resume", ""));
  parallel::ParallelTrainer trainer(
      spec, world.comm(),
      resume.empty() ? parallel::StateInit::kSeed : parallel::StateInit::kUnseeded);
  if (args.has("--init-weights"))
    trainer.load_weights(core::io::load_safetensors(args.get("--init-weights"), "--init-weights"),
                         "--init-weights");
  if (lead) print_attempt(spec, env, resume);
  checkpoint::ParallelCheckpoints ckpt(spec, trainer, resume);

  namespace fs = std::filesystem;
  std::optional<int64_t> resumed;
  if (continues_run(env, args.has("--resume"))) resumed = trainer.current_step();
  RunFolder folder = choose_run_folder(spec.train.out_dir, args.get_or("--metrics", ""), resumed);
  fs::path out = folder.out;
  const std::string& metrics_path = folder.metrics_path;
  std::unique_ptr<core::io::MetricsWriter> metrics;
  const planner::Degrees& d = trainer.plan().config.deg;
  if (lead) {
    if (!folder.note.empty()) std::printf("%s\n", folder.note.c_str());
    fs::create_directories(out);
    std::ofstream(out / "config.yaml") << core::job_spec_to_yaml(spec);
    metrics = open_metrics(folder, resumed);
    std::printf(
        "weft train: %s, %lld layers, dim %lld, %.2fM parameters, %lld tokens (train); world %d = "
        "dp %lld x "
        "tp %lld x pp %lld x ep %lld (%s), zero %d, launched by %s\n",
        spec.model.arch.c_str(), (long long)spec.model.layers, (long long)spec.model.dim,
        double(trainer.num_parameters()) / 1e6, (long long)data.train_tokens().size(), env.world,
        (long long)d.dp, (long long)d.tp, (long long)d.pp, (long long)d.ep,
        trainer.plan().config.schedule.c_str(), trainer.plan().config.zero, env.launcher.c_str());
    std::fflush(stdout);
  }
  auto train_batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };
  catch_stop_signals();
  TrainReport report(spec);
  NonfiniteGuard guard(spec.train);
  std::unique_ptr<core::Trainer> evaluator;  // rank 0, for validation
  auto t_start = std::chrono::steady_clock::now();
  bool stop = false;
  int64_t saved_at = trainer.current_step();  // a resumed run starts from a checkpoint
  while (trainer.current_step() < spec.train.steps && !stop) {
    auto t0 = std::chrono::steady_clock::now();
    core::StepStats st = trainer.step(train_batch);
    // Every rank has the same statistics, so every rank reaches the same verdict.
    NonfiniteGuard::Verdict verdict = guard.observe(st);
    std::string first_bad;
    if (verdict == NonfiniteGuard::Verdict::kStop)
      first_bad = trainer.first_nonfinite_gradient();  // collective, on the failure path only
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (lead) {
      core::io::StepMetrics m;
      m.step = st.step;
      m.loss = st.loss;
      m.lr = st.lr;
      m.grad_norm = st.grad_norm;
      m.tokens_per_s = double(st.tokens) / secs;
      m.world = env.world;
      m.epoch = env.rdzv_epoch;
      m.data_epoch = data.sampler().epoch(st.step);
      // Rank 0's share of the step in kernels and in waiting for communication.
      const parallel::StepTimes& tt = trainer.executor().last_step_times();
      const double mem = mib(trainer.activation_stats().bytes_live_peak);  // rank 0's
      m.extra = {{"step_ms", secs * 1e3}, {"compute_ms", tt.compute * 1e3},
                 {"comm_ms", tt.comm * 1e3}, {"mem_peak_mib", mem}};
      if (spec.model.arch == "moe-gpt") m.extra.insert(m.extra.begin(), {"aux_loss", st.aux_loss});
      if (!st.applied) m.extra.push_back({"skipped", 1});
      metrics->write_step(m);
      report.add_step(m);
      if (verdict == NonfiniteGuard::Verdict::kSkipped)
        std::printf("%s\n", guard.skipped_line(st).c_str());
      else if (verdict == NonfiniteGuard::Verdict::kApplied && spec.train.log_every > 0 &&
               (st.step % spec.train.log_every == 0 || st.step + 1 == spec.train.steps))
        std::printf(
            "step %5lld/%lld | loss %.4f%s | lr %.2e | grad %.3f | %8.0f tok/s | mem %.1f MiB | "
            "%.0f ms\n",
            (long long)st.step, (long long)spec.train.steps, st.loss,
            aux_cell(spec, st.aux_loss).c_str(), st.lr, st.grad_norm, m.tokens_per_s, mem,
            secs * 1e3);
      std::fflush(stdout);
    }
    // checkpoint.every: every rank writes its shard, rank 0 commits. After the step's metrics
    // line, never before: a crash between the two would leave a checkpoint whose step has
    // no line, and a restart resuming from it keeps only the lines before it.
    if (verdict != NonfiniteGuard::Verdict::kStop) ckpt.after_step();
    if (saved_by_every(spec, trainer.current_step())) saved_at = trainer.current_step();
    if (verdict == NonfiniteGuard::Verdict::kStop) throw Error(guard.stop_message(st, first_bad));
    bool last = trainer.current_step() == spec.train.steps;
    if (data.has_val() && spec.train.eval_every > 0 &&
        (trainer.current_step() % spec.train.eval_every == 0 || last)) {
      // Validation runs on rank 0 from the gathered weights through the single-process
      // evaluator (the same numbers as `weft train` on one process); the plan has no
      // forward-only program yet.
      core::NamedTensors now = trainer.gather_weights();  // collective
      if (lead) {
        if (!evaluator) {
          core::JobSpec one = spec;
          one.parallel = core::ParallelSpec();
          evaluator = std::make_unique<core::Trainer>(one);
        }
        evaluator->load_weights(now, "weights");
        // loss_free: the routing bias is state beside the weights (the same on every rank).
        if (trainer.moe_balance() && evaluator->moe_balance() &&
            trainer.moe_balance()->mode() == core::MoeBalance::Mode::kLossFree)
          evaluator->moe_balance()->copy_bias_from(*trainer.moe_balance());
        auto val_batch = [&](int64_t, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
          data.fill_val((b0 / spec.train.global_batch), b0 % spec.train.global_batch, n, x, y);
        };
        int64_t mbs = data.num_val_batches() * (spec.train.global_batch / spec.train.micro_batch);
        double val = evaluator->evaluate(val_batch, mbs);
        metrics->write_validation(st.step, val);
        report.add_validation(st.step, val);
        std::printf("step %5lld/%lld | val_loss %.4f\n", (long long)st.step,
                    (long long)spec.train.steps, val);
        std::fflush(stdout);
      }
    }
    stop = parallel::agree_stop(world.comm(), g_stop != 0);  // every rank stops at the same step
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::string final_save;
  if (stop && !spec.checkpoint.dir.empty() && saved_at != trainer.current_step())
    final_save = ckpt.save();  // collective: every rank agreed to stop at this step
  core::NamedTensors w;
  if (args.has("--save-weights")) w = trainer.gather_weights();  // collective
  if (!lead) return stop ? 130 : 0;
  if (stop)
    std::printf("interrupted: stopped cleanly after step %lld\n",
                (long long)trainer.current_step() - 1);
  if (!final_save.empty()) std::printf("interrupted: saved checkpoint %s\n", final_save.c_str());
  if (args.has("--save-weights")) core::io::save_safetensors(args.get("--save-weights"), w);
  metrics.reset();
  core::io::write_loss_curve_svg((out / "loss_curve.svg").string(),
                                 core::io::read_metrics(metrics_path));
  std::string summary = report.summary(total, trainer.activation_stats(), spec.memory.allocator);
  std::ofstream(out / "summary.txt") << summary;
  std::fputs(summary.c_str(), stdout);
  std::printf("run folder: %s (metrics.jsonl, loss_curve.svg, summary.txt)\n",
              out.string().c_str());
  return stop ? 130 : 0;
}

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
  while (trainer.current_step() < spec.train.steps && !g_stop) {
    auto t0 = std::chrono::steady_clock::now();
    core::StepStats st = trainer.step(train_batch);
    NonfiniteGuard::Verdict verdict = guard.observe(st);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    core::io::StepMetrics m;
    m.step = st.step;
    m.loss = st.loss;
    m.lr = st.lr;
    m.grad_norm = st.grad_norm;
    m.tokens_per_s = double(st.tokens) / secs;
    m.world = env.world;
    m.epoch = env.rdzv_epoch;
    m.data_epoch = data.sampler().epoch(st.step);
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
  if (g_stop) std::printf("interrupted: stopped cleanly after step %lld\n", (long long)trainer.current_step() - 1);
  if (g_stop && ckpt && !spec.checkpoint.dir.empty() && saved_at != trainer.current_step())
    std::printf("interrupted: saved checkpoint %s\n", ckpt->save(true).c_str());

  if (ckpt) ckpt->finish();
  if (args.has("--save-weights")) core::io::save_safetensors(args.get("--save-weights"), trainer.weights());
  core::io::write_loss_curve_svg((out / "loss_curve.svg").string(), core::io::read_metrics(metrics_path));
  std::string summary = report.summary(total, trainer.activation_stats(), spec.memory.allocator);
  std::ofstream(out / "summary.txt") << summary;
  std::fputs(summary.c_str(), stdout);
  std::printf("run folder: %s (metrics.jsonl, loss_curve.svg, summary.txt)\n", out.string().c_str());
  return g_stop ? 130 : 0;
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
  planner::ParallelConfig layout = planner::resolve_parallel(spec, env.world);
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
    core::cuda::CudaTrainer trainer(spec);
    return train_single(args, spec, env, trainer);
#else
    throw ConfigError("device", "this build has no CUDA (configure found none); use cpu");
#endif
  }
  // WEFT_PLAN_EXECUTOR=1 runs even one rank through the plan executor (the multi-rank code
  // path), so that `weft bench scaling` calibrates on the executor its layouts run on.
  if (env.world > 1 || env_int("WEFT_PLAN_EXECUTOR", 0) == 1) return train_ranks(args, spec, env);
  core::cpu::set_num_threads(int(spec.train.threads));
  planner::check_fits_memory(spec, 1, 1);  // before anything is allocated
  core::Trainer trainer(spec);  // activation arena: memory.allocator (caching | planned)
  return train_single(args, spec, env, trainer);
}


}  // namespace weft::launch
