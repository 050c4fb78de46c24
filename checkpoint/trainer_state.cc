// The single-process trainer's checkpoints and the safetensors export/import, all through
// the VPS's whole layout so that they read and write the same format as any parallel run.
#include "checkpoint/trainer_state.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/job_id.h"
#include "checkpoint/save_line.h"
#include "checkpoint/select.h"
#include "core/io/safetensors.h"
#include "core/models/weights.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

std::vector<core::Tensor> trainer_tensors(core::Trainer& trainer,
                                          const parallel::StateSpace& space) {
  std::vector<core::Tensor> out;
  for (const parallel::StateTensor& t : space.tensors()) {
    if (t.kind == parallel::StateKind::kBuffer) {
      out.push_back(parallel::buffer_tensor(trainer.moe_balance(), t));
      continue;
    }
    if (t.kind != parallel::StateKind::kScalar) {
      out.push_back(trainer.executor().tensor(t.value));
      continue;
    }
    int64_t v = t.name == parallel::kSeedState ? int64_t(trainer.spec().train.seed)
                                               : trainer.current_step();
    out.push_back(core::Tensor::from_vector<int64_t>({1}, {v}));
  }
  return out;
}

TrainerCheckpoints::TrainerCheckpoints(const core::JobSpec& spec, core::Trainer& trainer,
                                       const std::string& resume)
    : spec_(spec),
      trainer_(trainer),
      space_(parallel::StateSpace::from_graph(trainer.model().graph, trainer.moe_balance())),
      layout_(parallel::whole_layout(space_)),
      job_id_(this_job_id()) {
  if (resume.empty()) return;
  const std::string field = "--resume";
  Selection sel = select_checkpoint(resume, field, same_job_as(spec, field));
  const std::string& dir = sel.dir;
  const Metadata& m = sel.meta;
  // Load into fresh buffers first, so that a corrupted shard leaves the trainer untouched.
  std::vector<core::Tensor> fresh = parallel::allocate_locals(layout_.ranks[0]);
  load_checkpoint(dir, m, space_, layout_, 0, fresh, field);
  std::vector<core::Tensor> live = trainer_tensors(trainer_, space_);
  for (const parallel::StateTensor& t : space_.tensors())
    if (t.kind != parallel::StateKind::kScalar) live[size_t(t.id)].copy_from(fresh[size_t(t.id)]);
  trainer_.set_current_step(fresh[size_t(space_.find(parallel::kStepState))].data<int64_t>()[0]);
  print_resume(sel.skipped, dir, trainer_.current_step());
}

TrainerCheckpoints::~TrainerCheckpoints() = default;  // the saver waits for its thread

std::string TrainerCheckpoints::save(bool wait_for_it) {
  if (spec_.checkpoint.dir.empty())
    throw ConfigError("checkpoint.dir", "no folder to save checkpoints to; set checkpoint.dir");
  CheckpointInfo info{&spec_, trainer_.current_step(), "single process (whole tensors on rank 0)",
                      job_id_};
  HeldState held{{0}, {trainer_tensors(trainer_, space_)}};
  if (spec_.checkpoint.async && !wait_for_it) {
    const int64_t step = info.step;
    saver_.save(
        spec_.checkpoint.dir, info, space_, layout_, held, spec_.checkpoint.keep,
        [step](const std::string& dir, double secs) { print_saved(step, dir, secs, true); });
    return {};
  }
  saver_.wait();
  const auto t0 = std::chrono::steady_clock::now();
  std::string dir =
      save_checkpoint(spec_.checkpoint.dir, info, space_, layout_, held, spec_.checkpoint.keep);
  print_saved(info.step, dir,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), false);
  return dir;
}

void TrainerCheckpoints::after_step() {
  const int64_t every = spec_.checkpoint.every, done = trainer_.current_step();
  if (every > 0 && done > 0 && done % every == 0) save();
}

void TrainerCheckpoints::finish() { saver_.wait(); }

int64_t export_safetensors(const std::string& ckpt, const std::string& out,
                           const std::string& field) {
  Selection sel = select_checkpoint(ckpt, field);
  const std::string& dir = sel.dir;
  const Metadata& m = sel.meta;
  core::JobSpec spec = core::parse_job_spec(m.job_yaml, dir);
  check_model(m, spec, field);
  // The forward graph alone: its executor holds just the parameters, which export_weights
  // names exactly as --save-weights does. No balance: the checkpoint's buffers (loss_free's
  // routing bias) are not weights, and the load skips states this space lacks.
  core::ModelGraph mg = core::build_model(spec.model, 1);
  core::GraphExecutor ex(mg.graph);
  parallel::StateSpace space = parallel::StateSpace::from_graph(mg.graph);
  parallel::Layout layout = parallel::whole_layout(space);
  std::vector<core::Tensor> fresh = parallel::allocate_locals(layout.ranks[0]);
  load_checkpoint(dir, m, space, layout, 0, fresh, field);
  for (const parallel::StateTensor& t : space.tensors())
    if (t.kind != parallel::StateKind::kScalar) ex.tensor(t.value).copy_from(fresh[size_t(t.id)]);
  core::NamedTensors named = core::export_weights(mg, ex);
  char hash[20];
  std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)m.model_hash);
  core::io::save_safetensors(
      out, named,
      {{"format", "pt"}, {"weft.model_hash", hash}, {"weft.step", std::to_string(m.step)}});
  return int64_t(named.size());
}

std::string import_safetensors(const std::string& in, const std::string& root,
                               const core::JobSpec& spec, const std::string& field, bool force) {
  // Refused before anything is read or written: in a folder with other checkpoints, --resume
  // would take a newer one and retention would never remove theirs.
  std::error_code ec;
  if (fs::exists(root) && !fs::is_empty(root, ec) && !force) {
    std::vector<std::string> there = list_checkpoints(root);
    throw ConfigError("DIR", root + " is not empty (" +
                                 (there.empty() ? std::string("it holds other files")
                                                : "it holds " + std::to_string(there.size()) +
                                                      " checkpoint(s), newest " +
                                                      fs::path(there.back()).filename().string()) +
                                 "): --resume " + root +
                                 " would take the newest of them, not the import; import into a "
                                 "new or empty folder, or pass --force to write step-00000000 "
                                 "next to them");
  }
  core::Trainer trainer(spec);
  trainer.load_weights(core::io::load_safetensors(in, field), field);
  // With the trainer's balance: a loss_free job's step-0 checkpoint holds its (zero) routing
  // bias, so that resuming from it finds every state it needs.
  parallel::StateSpace space =
      parallel::StateSpace::from_graph(trainer.model().graph, trainer.moe_balance());
  parallel::Layout layout = parallel::whole_layout(space);
  CheckpointInfo info{&spec, 0, "imported from " + fs::path(in).filename().string()};
  try {
    return save_checkpoint(root, info, space, layout,
                           HeldState{{0}, {trainer_tensors(trainer, space)}},
                           std::max<int64_t>(spec.checkpoint.keep, 1));
  } catch (const NonFiniteStateError& e) {
    throw ConfigError(field, std::string(e.what()) + "; the weights of " + in +
                                 " are not finite: fix or re-export them");
  }
}

}  // namespace weft::checkpoint
