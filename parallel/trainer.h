// The multi-rank trainer: plans the job for the world, builds the process groups and the
// rank's executor, and runs optimizer steps whose numbers equal the single-process
// core::Trainer's (the objective is the mean over the global batch; clipping by the global
// norm over all shards; AdamW; learning_rate()).
#pragma once

#include "core/exec/activation_memory.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "core/config/job_spec.h"
#include "core/exec/trainer.h"
#include "core/graph/moe_balance.h"
#include "core/models/weights.h"
#include "memory/allocator.h"
#include "parallel/executor.h"
#include "parallel/process_groups.h"
#include "parallel/vps.h"
#include "planner/plan.h"

namespace weft::parallel {

// What a new trainer does with its state: the state roots (TensorTable::state_root: the
// parameters, optimizer moments and master weights this rank holds, layout_of()'s plan
// tensors). Gradient accumulators and other persistent tensors are allocated in every case.
// Where a trainer's construction went, in seconds (the resize line's plan phase).
struct TrainerSetupTimes {
  double graph = 0, plan = 0, check = 0, groups = 0, executor = 0, init = 0;
};

enum class StateInit : uint8_t {
  kSeed,      // allocated; parameters seeded from train.seed, moments zero
  kUnseeded,  // allocated and zeroed, for a caller that loads every state tensor next through
              // state_tensors() (a checkpoint: seeding 354M parameters takes about 45 s on one
              // core, all of it overwritten by the load)
  kDeferred,  // not allocated at all until adopt_state() (an online resize: the router builds
              // this rank's state, so that the rank's peak stays at its shard plus the
              // router's budget instead of the old state plus the new)
};

// What a trainer can take from earlier ones of the same job in this process instead of
// making it again (an online resize builds a trainer per world; planner::PlanCache keeps
// the graph and the plans). Every field is optional.
struct TrainerParts {
  // planner::build_planning_graph(spec); null: built by the trainer.
  std::shared_ptr<const core::ModelGraph> graph;
  // planner::make_plan(spec, graph->graph, world.size()) (simulation not needed); null:
  // planned by the trainer, under CostModel's defaults (planner::training_plan_options()).
  // `weft train` gives the plan made under the job's cost model (launch/job_cost_model.h),
  // the same on every rank. Checked like a plan the trainer made (InternalError for another
  // world size, ConfigError naming "plan" for another model or batch).
  std::shared_ptr<const planner::Plan> plan;
  // Serves the persistent tensors (gradient accumulators, and the state unless kDeferred)
  // and the activation arena's big segments: a memory::RecyclingAllocator hands a new
  // trainer the blocks an old one freed, and keeps the old arena's pages for the new
  // layout's blocks rather than unmapping them at the old trainer's end. Null: the host
  // allocator. Must outlive the trainer and every tensor it allocated (state_tensors()
  // views, hold_state).
  memory::Allocator* persistent = nullptr;
  // The process groups, split ahead over the trainer's `world` (an online resize connects
  // them with the next world's communicator while the old world ends its step). Taken when
  // they fit the trainer's plan over `world` (ProcessGroups::fits); otherwise dropped and
  // split anew, as with null. Every rank must pass groups that fit, or none: the split is
  // collective.
  std::unique_ptr<ProcessGroups> groups;
};

class ParallelTrainer {
 public:
  // Collective over `world` (every rank, same spec). Plans (ConfigError naming the field for
  // degrees that do not fit the world or the model, and for a layout whose peak memory on
  // some rank exceeds WEFT_MEMORY_GIB when set; all before any communication), refuses a
  // plan that fails validation, splits the process groups and sets up the state as `init`
  // says. `world` must outlive the trainer.
  ParallelTrainer(const core::JobSpec& spec, comm::Communicator& world,
                  StateInit init = StateInit::kSeed);
  // The same, with what `parts` provides instead of making it.
  ParallelTrainer(const core::JobSpec& spec, comm::Communicator& world, StateInit init,
                  TrainerParts parts);
  ~ParallelTrainer();

  // One optimizer step on the global batch of current_step(); advances the step. Collective.
  // The returned statistics are those of the whole global batch, on every rank.
  // A non-finite loss or gradient norm on any rank drops the update on every rank
  // (StepStats::applied false; RankExecutor::set_loss_values says how, with no extra
  // collective). InternalError on a kDeferred trainer before adopt_state().
  //
  // Failure (a peer died: CommError, PeerLostError, TimeoutError out of the executor, which
  // is then unusable, so the trainer is only read and destroyed): torn() says what the
  // rank's state is.
  // Not torn: the state is exactly that of current_step(), complete on this rank: either
  // the step threw before this rank changed anything (current_step() did not advance), or
  // the rank ran its whole step program and only the statistics exchange after it failed
  // (current_step() did advance). Torn: the step threw after this rank began updating (an
  // adamw ran, ZeRO's gather of updated shards, the loss-free bias update), so its state is
  // a mix of two steps and a resize must take it from elsewhere.
  core::StepStats step(const core::BatchFn& batch);
  // Whether the last step() threw after it began changing this rank's state (see step()).
  // False before any step, after a step that returned, and after adopt_state(). May be true
  // although nothing changed (RankExecutor::state_written: it is set just before a writing
  // instruction runs, and a dropped step's adamw counts), never false when something did.
  bool torn() const { return torn_; }
  // The statistics of the last step() whose statistics exchange completed on this rank,
  // also when a later collective of that step then failed (torn or not): every rank agreed
  // on them, so a step some peer finished gets its metrics line from any rank that knows
  // them. Empty before the exchange of the last step() (it threw earlier).
  const std::optional<core::StepStats>& exchanged_stats() const { return exchanged_; }
  // The exchanged records those statistics were folded from (every rank's, the same on
  // every rank that completed the exchange): what a rank behind needs (finish_step).
  const std::vector<double>& exchanged_values() const { return exchanged_values_; }
  // Whether the last step() stopped right before this rank's first state write because its
  // statistics exchange (or the before_update hook) threw, and the rest of its step program
  // needs no peer (RankExecutor::can_finish_step: decided from the program; not under ZeRO-1/2,
  // whose updated shards are gathered after adamw, nor with loss_free's bias update). The
  // rank then holds its reduced gradients and the step's norm: finish_step can complete the
  // step with the statistics a peer got.
  bool can_finish_step() const { return !torn_ && exec_ && exec_->can_finish_step(); }
  // Completes the stopped step (can_finish_step()) with `exchanged`, the step's exchanged
  // records as a rank that completed the exchange got them (exchanged_values()): folds them
  // as step() would, runs the rest of the step program locally (no communication: the
  // world may be gone), advances current_step() and returns the step's statistics. The
  // state is then bit for bit what a step() whose exchange completed leaves. InternalError,
  // with nothing changed, when the step cannot be finished or when `exchanged` is not this
  // step's (its gradient norm differs from the one this rank reduced).
  core::StepStats finish_step(const std::vector<double>& exchanged);
  // Runs in every later step() right before this rank's first state write (after the step's
  // statistics exchange; the executor's before_update): an in-memory snapshot of the state
  // before the step, copied in the background while the forward and backward ran, is waited
  // for there. An exception out of it fails the step before any state changed (not torn).
  void set_before_update(std::function<void()> f) { before_update_ = std::move(f); }
  // Tests only: runs in every later step() right after this rank's statistics exchange
  // returned, before the rank keeps the statistics; an exception out of it is the exchange
  // failing on this rank after its peers got everything (a reproducible split: some ranks
  // ahead, some behind).
  void set_after_exchange(std::function<void()> f) { after_exchange_ = std::move(f); }
  // The first parameter (graph order) whose gradient of the last step holds a NaN or an Inf
  // in some rank's local pieces; empty when none does. Collective; the same on every rank.
  std::string first_nonfinite_gradient();

  // The full parameters under their reference names (core/models/weights.h), assembled from
  // every rank's pieces. Collective; the result is on every rank.
  core::NamedTensors gather_weights();
  // Replaces the parameters by `w` (every rank passes the same tensors). ConfigError naming
  // `field` when they do not fit the model; nothing changes then.
  void load_weights(const core::NamedTensors& w, const std::string& field);

  int64_t current_step() const { return step_; }
  // Resuming: the next step() runs step `s` (learning rate, Adam bias correction, data).
  void set_current_step(int64_t s) { step_ = s; }
  // This rank's state in the order of `layout.locals` (layout_of(space, plan(), rank()),
  // space from graph()): views of the executor's persistent tensors, so a caller may read
  // them for a save or copy into them for a load; the scalars (step, seed, data cursor) are
  // fresh i64 tensors. The same table the executor allocates from, never a re-derivation.
  // InternalError on a kDeferred trainer before adopt_state().
  std::vector<core::Tensor> state_tensors(const StateSpace& space, const RankLayout& layout);
  // Installs this rank's state: `tensors` in `layout.locals` order (layout = layout_of(space,
  // plan(), rank()), space = StateSpace::from_graph(graph(), moe_balance()); what the
  // router's run_transition returns). Each parameter, moment and master tensor is moved in
  // (no copy: the trainer owns that storage afterwards, and views of the old roots are
  // dropped) as the executor's root of LocalTensor::plan_tensor; the buffers (loss_free's
  // routing bias) are copied into moe_balance(); current_step() becomes the step scalar.
  // Everything is checked before anything changes: InternalError naming the state for a
  // tensor of another shape or dtype than the layout's, a layout that does not name this
  // trainer's state roots (another plan or rank) or leaves one of them or a buffer out, a
  // seed scalar other than train.seed, a data cursor other than the step; the trainer and
  // `tensors` are then as they were. On success `tensors` is left empty, every state root is
  // defined and torn() is false. Works on any trainer (it replaces the state); a kDeferred
  // trainer needs it before step(), state_tensors(), gather_weights() and load_weights().
  // Local: no communication.
  void adopt_state(const StateSpace& space, const RankLayout& layout,
                   std::vector<core::Tensor>& tensors);
  // The planning graph the plan and the executor are built on (StateSpace::from_graph).
  const core::Graph& graph() const { return mg_->graph; }
  const core::JobSpec& spec() const { return spec_; }
  comm::Communicator& world() { return world_; }
  const ProcessGroups& groups() const { return *groups_; }
  // This rank's transient-arena statistics (peak live, peak reserved).
  memory::AllocatorStats activation_stats() const { return memory_->stats(); }
  int64_t num_parameters() const;
  const planner::Plan& plan() const { return *plan_; }
  RankExecutor& executor() { return *exec_; }
  // The global-batch expert balancing state (aux_loss_global, loss_free); null otherwise.
  // The same on every rank after each step.
  core::MoeBalance* moe_balance() { return balance_.get(); }
  // Known without the world: a trainer kept for finish_step outlives its world.
  int rank() const { return rank_; }
  const TrainerSetupTimes& setup_times() const { return setup_times_; }
  // Whether the trainer took the process groups TrainerParts gave (built ahead).
  bool groups_given() const { return groups_given_; }

 private:
  // The step's statistics from the exchanged (kind, addend, addends, value) records.
  core::StepStats fold_statistics(const std::vector<double>& all, core::StepStats st) const;
  // The statistics of step `step` (its learning rate) folded from `all`, checked.
  core::StepStats statistics_of(int64_t step, const std::vector<double>& all) const;
  void check_memory_budget() const;
  // InternalError naming `what` while a kDeferred trainer waits for adopt_state().
  void require_state(const char* what) const;
  // The full value of every parameter, from every rank's pieces.
  std::vector<core::Tensor> gather_parameters();

  core::JobSpec spec_;
  comm::Communicator& world_;
  std::shared_ptr<const core::ModelGraph> mg_;  // the planning graph (batch = the global batch)
  std::shared_ptr<const planner::Plan> plan_;
  std::unique_ptr<ProcessGroups> groups_;
  // The transient arena of memory.allocator (caching | planned), as in core::Trainer;
  // declared before the executor so that it outlives the tensors it serves.
  std::unique_ptr<core::ActivationMemory> memory_;
  std::unique_ptr<RankExecutor> exec_;
  std::unique_ptr<core::MoeBalance> balance_;
  int64_t step_ = 0;
  int64_t steps_run_ = 0;  // by this process: the activation arena traces its first step
  bool state_pending_ = false;  // kDeferred, adopt_state() not yet called
  bool torn_ = false;
  std::optional<core::StepStats> exchanged_;
  std::vector<double> exchanged_values_;
  std::function<void()> before_update_;
  std::function<void()> after_exchange_;
  int rank_ = 0;
  TrainerSetupTimes setup_times_;
  bool groups_given_ = false;
};

}  // namespace weft::parallel
