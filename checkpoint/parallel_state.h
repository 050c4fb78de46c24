// Checkpoints of the multi-rank trainer (`weft train` on several ranks: checkpoint.every,
// --resume DIR): each rank saves and loads exactly the VPS boxes layout_of gives it.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "parallel/trainer.h"

namespace weft::checkpoint {

// The multi-rank counterpart of TrainerCheckpoints, built by every rank (collective).
// The layout is layout_of(space, trainer.plan()) over all ranks: replicas decide which rank
// writes a replicated box, and each rank's own boxes are what it loads.
class ParallelCheckpoints {
 public:
  // The ranks agree on a job id (rank 0 draws it). Resuming (`resume` not empty): rank 0
  // chooses the newest checkpoint under `resume` that passes every check (select.h; it
  // prints each newer one skipped) and broadcasts its step; every rank then loads its boxes
  // of that step folder (or of `resume` when it names one), reading only the byte ranges it
  // needs, and sets the trainer's step. ConfigError("--resume") on every rank when none
  // passes, for a missing folder, another model, another train.seed or train.global_batch,
  // or a corrupted shard (the ranks agree before anything changes, so the trainer is
  // untouched then and no rank hangs).
  ParallelCheckpoints(const core::JobSpec& spec, parallel::ParallelTrainer& trainer,
                      const std::string& resume = {});

  // Saves when checkpoint.every > 0 and divides the steps done. Collective.
  void after_step();
  // Saves now through save_checkpoint_ranks (every rank writes its shard, rank 0 commits and
  // prints the save line); returns the step folder on every rank. Synchronous even with
  // checkpoint.async: a background save would need its own communicator for the commit.
  std::string save();

  const parallel::StateSpace& space() const { return space_; }
  const parallel::Layout& layout() const { return layout_; }
  const std::string& job_id() const { return job_id_; }

 private:
  void resume_from(const std::string& resume);

  const core::JobSpec& spec_;
  parallel::ParallelTrainer& trainer_;
  parallel::StateSpace space_;
  parallel::Layout layout_;
  std::string job_id_;
};

}  // namespace weft::checkpoint
