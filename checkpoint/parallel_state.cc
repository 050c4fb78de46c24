// The multi-rank trainer's checkpoints: the same format and the same checks as the
// single-process path (trainer_state.cc), through the executor's own layout.
#include "checkpoint/parallel_state.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/job_id.h"
#include "checkpoint/retention.h"
#include "checkpoint/save_line.h"
#include "checkpoint/select.h"
#include "core/tensor.h"
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
  job_id_ = agree_job_id(trainer_.world());
  if (!resume.empty()) resume_from(resume);
}

void ParallelCheckpoints::resume_from(const std::string& resume) {
  const std::string field = "--resume";
  const int rank = trainer_.rank();
  const parallel::RankLayout& mine = layout_.ranks.at(size_t(rank));
  // Rank 0 alone walks and fully verifies the candidates (one read of the checkpoint, not
  // one per rank), then broadcasts the chosen step; -1: none, and rank 0 throws its error.
  Selection sel;
  std::exception_ptr choice_failed;
  if (rank == 0) {
    try {
      sel = select_checkpoint(resume, field, same_job_as(spec_, field));
    } catch (const std::exception&) {
      choice_failed = std::current_exception();
    }
  }
  core::Tensor chosen =
      core::Tensor::from_vector<int64_t>({1}, {choice_failed ? -1 : sel.meta.step});
  trainer_.world().broadcast(chosen).wait();
  if (choice_failed) std::rethrow_exception(choice_failed);
  const int64_t step = chosen.data<int64_t>()[0];
  if (step < 0)
    throw ConfigError(field, "another rank (rank 0) found no checkpoint to resume from under " +
                                 resume + " (its error lists why each was refused)");
  const bool names_step = std::filesystem::exists(std::filesystem::path(resume) / kMetadataFile);
  const std::string dir =
      names_step ? resume : (std::filesystem::path(resume) / step_name(step)).string();
  std::vector<core::Tensor> fresh;
  std::exception_ptr failure;
  // Every rank checks and loads into fresh buffers; then they agree, so that one rank's
  // unreadable byte range fails them all before any state changes (and none waits forever).
  try {
    Metadata m = read_metadata(dir, field);
    if (m.step != step)
      throw ConfigError(field, dir + " holds step " + std::to_string(m.step) + ", rank 0 chose " +
                                   std::to_string(step) + ": the ranks see different folders");
    same_job_as(spec_, field)(m);
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
  int64_t loaded_step = -1;
  for (size_t i = 0; i < mine.locals.size(); ++i) {
    const parallel::StateTensor& t = space_.at(mine.locals[i].state);
    if (t.kind != parallel::StateKind::kScalar)
      live[i].copy_from(fresh[i]);
    else if (t.name == parallel::kStepState)
      loaded_step = fresh[i].data<int64_t>()[0];
  }
  if (loaded_step < 0)
    throw InternalError("the layout of rank " + std::to_string(rank) + " has no step");
  trainer_.set_current_step(loaded_step);
  if (rank == 0) print_resume(sel.skipped, dir, loaded_step);
}

void ParallelCheckpoints::after_step() {
  const int64_t every = spec_.checkpoint.every, done = trainer_.current_step();
  if (every > 0 && done > 0 && done % every == 0) save();
}

std::string ParallelCheckpoints::save() {
  if (spec_.checkpoint.dir.empty())
    throw ConfigError("checkpoint.dir", "no folder to save checkpoints to; set checkpoint.dir");
  const int rank = trainer_.rank();
  CheckpointInfo info{&spec_, trainer_.current_step(), layout_name(trainer_.plan()), job_id_};
  std::vector<core::Tensor> locals = trainer_.state_tensors(space_, layout_.ranks.at(size_t(rank)));
  const auto t0 = std::chrono::steady_clock::now();
  std::string dir = save_checkpoint_ranks(spec_.checkpoint.dir, info, space_, layout_, rank, locals,
                                          spec_.checkpoint.keep, trainer_.world());
  if (rank == 0)
    print_saved(info.step, dir,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                false);
  return dir;
}

}  // namespace weft::checkpoint
