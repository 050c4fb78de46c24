// The multi-rank trainer's checkpoints: the same format and the same checks as the
// single-process path (trainer_state.cc), through the executor's own layout.
#include "checkpoint/parallel_state.h"

#include <exception>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "parallel/launch_env.h"

namespace weft::checkpoint {

namespace {

std::string layout_name(const planner::Plan& plan) {
  const planner::Degrees& d = plan.config.deg;
  std::ostringstream os;
  os << "dp " << d.dp << " x tp " << d.tp << " x pp " << d.pp << " x ep " << d.ep << ", zero "
     << plan.config.zero << " (" << plan.world() << " ranks)";
  return os.str();
}

}  // namespace

ParallelCheckpoints::ParallelCheckpoints(const core::JobSpec& spec,
                                         parallel::ParallelTrainer& trainer,
                                         const std::string& resume)
    : spec_(spec),
      trainer_(trainer),
      space_(parallel::StateSpace::from_graph(trainer.graph(), trainer.moe_balance())),
      layout_(parallel::layout_of(space_, trainer.plan())) {
  if (resume.empty()) return;
  const std::string field = "--resume";
  const int rank = trainer_.rank();
  const parallel::RankLayout& mine = layout_.ranks.at(size_t(rank));
  std::vector<core::Tensor> fresh;
  std::string dir;
  std::exception_ptr failure;
  // Every rank checks and loads into fresh buffers; then they agree, so that one rank's
  // corrupted byte range fails them all before any state changes (and none waits forever).
  try {
    dir = resolve_checkpoint(resume, field);
    Metadata m = read_metadata(dir, field);
    check_model(m, spec, field);
    if (m.seed != spec.train.seed)
      throw ConfigError(
          field, "the checkpoint was trained with train.seed " + std::to_string(m.seed) +
                     ", this job has " + std::to_string(spec.train.seed) +
                     ": data order would change; add --set train.seed=" + std::to_string(m.seed));
    if (m.global_batch != spec.train.global_batch)
      throw ConfigError(
          field, "the checkpoint was trained with train.global_batch " +
                     std::to_string(m.global_batch) + ", this job has " +
                     std::to_string(spec.train.global_batch) +
                     ": its data cursor would point elsewhere; add --set train.global_batch=" +
                     std::to_string(m.global_batch));
    fresh = parallel::allocate_locals(mine);
    load_checkpoint(dir, m, space_, layout_, rank, fresh, field);
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  const bool any_failed = parallel::agree_stop(trainer_.world(), failure != nullptr);
  if (failure) std::rethrow_exception(failure);
  if (any_failed)
    throw ConfigError(field, "another rank could not load its part of the checkpoint " + dir +
                                 " (its error names the cause); nothing was loaded");
  std::vector<core::Tensor> live = trainer_.state_tensors(space_, mine);
  int64_t step = -1;
  for (size_t i = 0; i < mine.locals.size(); ++i) {
    const parallel::StateTensor& t = space_.at(mine.locals[i].state);
    if (t.kind != parallel::StateKind::kScalar)
      live[i].copy_from(fresh[i]);
    else if (t.name == parallel::kStepState)
      step = fresh[i].data<int64_t>()[0];
  }
  if (step < 0) throw InternalError("the layout of rank " + std::to_string(rank) + " has no step");
  trainer_.set_current_step(step);
  if (rank == 0) WEFT_INFO("checkpoint", "resumed from ", dir, " at step ", step);
}

void ParallelCheckpoints::after_step() {
  const int64_t every = spec_.checkpoint.every, done = trainer_.current_step();
  if (every > 0 && done > 0 && done % every == 0) save();
}

std::string ParallelCheckpoints::save() {
  if (spec_.checkpoint.dir.empty())
    throw ConfigError("checkpoint.dir", "no folder to save checkpoints to; set checkpoint.dir");
  const int rank = trainer_.rank();
  CheckpointInfo info{&spec_, trainer_.current_step(), layout_name(trainer_.plan())};
  std::vector<core::Tensor> locals =
      trainer_.state_tensors(space_, layout_.ranks.at(size_t(rank)));
  return save_checkpoint_ranks(spec_.checkpoint.dir, info, space_, layout_, rank, locals,
                               spec_.checkpoint.keep, trainer_.world());
}

}  // namespace weft::checkpoint
