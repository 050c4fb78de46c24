// Checkpoints of the single-process trainer (`weft train --resume DIR`, checkpoint.every)
// and the consolidated safetensors export and import (`weft ckpt`). The trainer's state is
// the VPS's whole layout: every state tensor on rank 0, viewed in place in the executor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/exec/trainer.h"

namespace weft::checkpoint {

// The trainer's state tensors in whole_layout(space) order (views of the executor's
// tensors and, for the buffers, of the trainer's MoeBalance routing biases; the scalars are
// fresh i64 tensors holding step, seed and data cursor). `space` is
// StateSpace::from_graph(trainer.model().graph, trainer.moe_balance()).
std::vector<core::Tensor> trainer_tensors(core::Trainer& trainer,
                                          const parallel::StateSpace& space);

// The hooks cmd_train calls: construct after the trainer (resumes when `resume` is not
// empty), call after_step() after every optimizer step, finish() at the end.
class TrainerCheckpoints {
 public:
  // Draws this job's id (job_id.h). Resuming: loads the newest checkpoint under `resume`
  // that passes every check (select.h; each newer one skipped is printed with its reason),
  // or that step folder, into the trainer and sets its step. ConfigError("--resume") when
  // none passes or the named folder does not: a missing folder, edited metadata, a
  // corrupted shard, another model, another train.seed or train.global_batch (the data
  // cursor would mean other data); the trainer is untouched then.
  TrainerCheckpoints(const core::JobSpec& spec, core::Trainer& trainer,
                     const std::string& resume = {});
  ~TrainerCheckpoints();

  // Saves when checkpoint.every > 0 and divides the steps done (in the background when
  // checkpoint.async). Rethrows the previous background save's failure.
  void after_step();
  // Saves now, synchronously unless checkpoint.async; returns the step folder (empty
  // while an asynchronous save is still writing). Prints the save line (save_line.h) once
  // committed. Throws NonFiniteStateError for a NaN or infinity in the state.
  std::string save(bool wait_for_it = false);
  // Waits for a background save and rethrows its failure.
  void finish();

  const parallel::StateSpace& space() const { return space_; }
  const std::string& job_id() const { return job_id_; }

 private:
  const core::JobSpec& spec_;
  core::Trainer& trainer_;
  parallel::StateSpace space_;
  parallel::Layout layout_;
  std::string job_id_;
  AsyncSaver saver_;
};

// `weft ckpt export`: the parameters of a checkpoint as one safetensors file named as
// core/models/weights.h names them (experts one tensor each), f32. Returns the tensors
// written. ConfigError(field) for a missing or corrupted checkpoint.
int64_t export_safetensors(const std::string& ckpt, const std::string& out,
                           const std::string& field = "DIR");

// `weft ckpt import`: a step-0 checkpoint under `root` holding the weights of `in` for the
// job `spec` (optimizer moments zero); returns the step folder. ConfigError naming `field`
// for weights of another model or holding a NaN or infinity, and ConfigError("DIR") when
// `root` is not empty and not `force` (--resume DIR would take a newer step folder there).
std::string import_safetensors(const std::string& in, const std::string& root,
                               const core::JobSpec& spec,
                               const std::string& field = "in.safetensors", bool force = false);

}  // namespace weft::checkpoint
