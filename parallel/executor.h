// The plan executor: runs one rank's RankProgram (planner/plan.h, docs/planner.md "Executor
// contract") for one optimizer step: loads, compute on local pieces, collectives on the
// plan's process groups, point-to-point transfers between pipeline stages, frees.
//
// Threads: one thread drives an executor. Sends are asynchronous (their Work owns the
// buffer until the matching receive completed, so a free does not wait; the end of the step
// does). Gradient-bucket collectives (grad.sync) run while later backward compute goes on:
// an instruction touching a bucket's tensors, or the end of the step, completes it first;
// buckets complete in issue order, which each communicator keeps. Receives are posted up
// to two receive instructions ahead, into buffers of their own, and waited for (then copied)
// at their instruction. Other collectives block. Any communication failure propagates as the
// communicator's exception (PeerLostError names the lost peer, TimeoutError after the
// communicator's timeout); the executor is then unusable. state_written() then says whether
// this step had already started changing the rank's state (ParallelTrainer::torn()).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/graph/graph.h"
#include "core/graph/op_table.h"
#include "parallel/collectives.h"
#include "parallel/process_groups.h"
#include "parallel/tensor_table.h"
#include "planner/plan.h"

namespace weft::parallel {

// Fills the local tensor `out` holding `box` of input value `value` (token ids or targets)
// for the current step.
using LoadFn = std::function<void(int value, const planner::Box& box, core::Tensor& out)>;

// Where one step's wall time went on this rank, in seconds: compute kernels; waiting for
// communication (receives, blocking collectives, completing gradient buckets, the end of the
// step's sends); everything else (loads, copies, issuing sends and buckets, frees).
struct StepTimes {
  double compute = 0, comm = 0, other = 0;
};

class RankExecutor {
 public:
  // Refuses (InternalError from planner::require_valid) a plan that fails validation.
  // `plan`, `g`, `world` and `groups` must outlive the executor; `g` is the planning graph
  // (planner::build_planning_graph) the plan was made from. `defer_state`: the state roots
  // (TensorTable::state_root) are not allocated; the caller adopts them into tensors()
  // before the first run_step. `persistent` (optional) serves the persistent tensors
  // (TensorTable's `state` allocator); it must outlive them.
  RankExecutor(const planner::Plan& plan, const core::Graph& g, int rank, comm::Communicator& world,
               const ProcessGroups& groups, bool defer_state = false,
               memory::Allocator* persistent = nullptr);
  ~RankExecutor();

  // Seeds every local parameter piece from its global element indices (same numbers as
  // core::init_parameters on the whole model).
  void init_parameters(uint64_t seed);

  // One optimizer step: zeroes the gradient accumulators and runs the program. `s.step` and
  // `s.lr` are the step's; `s.loss_scale` must be 1 / (batch parts of the step).
  // `s.moe_balance` (aux_loss_global, loss_free) is summed over `world` mid-step (global
  // shares, before the first backward) or at its end (the loss-free bias update).
  // `before_update` (optional) runs once per step on this rank, right before its first
  // instruction that changes state (after the gradient norm's reduction, which every
  // adamw waits for): a step's statistics exchanged there fail, if a peer died, while the
  // state is still that of the step's start (ParallelTrainer::torn()).
  void run_step(const core::StepScalars& s, const LoadFn& load,
                const std::function<void()>& before_update = {});
  // Whether the last run_step (finished or thrown out of) reached an instruction that
  // changes the rank's state: an adamw, any instruction writing into a state root (ZeRO's
  // gather of the updated shards), or the loss-free bias update. Set before such an
  // instruction runs, so true may mean "about to": a caller treats the state as changed. A
  // dropped step's adamw counts too although it leaves the state as it was. False: the
  // step changed nothing a later step or a checkpoint reads (gradients are zeroed per step).
  bool state_written() const { return state_written_; }

  // A step whose before_update threw (its statistics exchange lost a peer) stopped at the
  // instruction it was about to run, its gradients reduced and its norm known: whether this
  // rank can run the rest of that step program alone (finish_step). Decided from the
  // program: every instruction from there on is local compute, a copy or a free (no send,
  // receive or collective: ZeRO-1/2's gather of the updated shards is one), nothing is in
  // flight, and no loss-free bias update (a sum over the world) follows. False after a step
  // that returned or threw elsewhere.
  bool can_finish_step() const;
  // Runs the rest of the stopped step (can_finish_step(), else InternalError) without any
  // communication, so that the rank holds exactly what it would have held had before_update
  // returned. The communicators may be gone by then: nothing here touches them.
  void finish_step();

  // The values (the loss, the balance losses) whose non-finite local pieces make the step's
  // gradient norm non-finite, so that adamw drops the step on every rank with no extra
  // collective: the rank folds a NaN into its norm.sumsq partial sums (reduced over the
  // stages and lanes, and over data-parallel replicas for sharded gradients) and into the
  // first gradient bucket it all-reduces or reduce-scatters over data-parallel replicas.
  void set_loss_values(const std::vector<int>& values);
  // The global gradient norm of the last step as this rank computed it (NaN when the step
  // was dropped); every rank sees the same value.
  double last_grad_norm() const { return last_norm_; }

  const planner::RankProgram& program() const { return prog_; }
  const StepTimes& last_step_times() const { return times_; }
  // Per-instruction timing, for attributing a step's time against the simulator's price of
  // each instruction (`weft bench scaling --attribute`): with $WEFT_INSTR_TIMES naming a
  // folder, every step after the first adds each program position's seconds (its wait for
  // in-flight buckets apart), and the destructor writes their means to
  // <folder>/instr-<rank>.tsv. Unset: nothing is timed beyond StepTimes.
  struct InstrTimes {
    std::vector<double> run_s, settle_s;  // per program position, summed over timed steps
    double tail_s = 0;                    // the step's end: buckets and sends completed
    double update_s = 0;                  // the caller's before_update (statistics exchange)
    int steps = 0, seen = 0;              // timed steps; steps run (the first is not timed)
  };
  TensorTable& tensors() { return *table_; }
  void set_transient_allocator(memory::Allocator* a) { table_->set_transient_allocator(a); }
  int rank() const { return prog_.rank; }

 private:
  void send(const planner::Instr& in);
  void recv(const planner::Instr& in);
  // Posts the receives of the next kRecvAhead receive instructions from program position
  // `from` into buffers of their own.
  void post_receives_ahead(size_t from);
  void wait_all_sends();
  int small_tag(bool send, int peer, int64_t tag) const;
  // Root tensors (aliases resolved) an instruction reads or writes.
  std::vector<int> roots(const planner::Instr& in) const;
  // Completes the in-flight buckets that `touched` depends on (and those issued before them).
  void settle(const std::vector<int>& touched);
  void complete(const planner::Instr& in, PendingCollective& p);
  // Whether a local piece of a set_loss_values() value written this step is not finite;
  // `complete` says whether every local piece has been written this step.
  bool local_loss_nonfinite(bool* complete);
  // Writes a NaN into the first float input of `in` (a gradient bucket) that is a view.
  void poison_first_input(const planner::Instr& in);
  // The instruction kinds that need no peer, shared by run_step and finish_step.
  void compute(const planner::Instr& in, core::StepScalars& s);
  void local_copy(const planner::Instr& in);
  // last_norm_ from the step's grad_norm piece.
  void read_last_norm();

  struct InFlight {
    const planner::Instr* instr;
    PendingCollective op;
    std::vector<int> roots;
  };

  const planner::Plan& plan_;
  const core::Graph& g_;
  planner::RankProgram prog_;
  comm::Communicator& world_;
  const ProcessGroups& groups_;
  std::unique_ptr<TensorTable> table_;
  MoeState moe_;
  // The plan's message tags are 64-bit; the transports carry [0, kMaxTag]. Per peer and
  // direction the plan's tags, sorted, map to their index: both ends compute the same map.
  std::map<std::pair<int, int64_t>, int> send_tag_, recv_tag_;
  std::map<int, std::vector<comm::Work>> sends_;  // tensor -> sends in flight this step
  // Receives posted before their instruction runs (program position -> buffer and Work).
  // A receive posted early makes the sender's transport see a ready receiver, so the
  // sender writes the message from its own thread at send time; posted late, the message
  // waits for the sender's transport thread, which on a busy core waits for a time slice.
  struct PostedRecv {
    core::Tensor buffer;
    comm::Work work;
  };
  std::map<size_t, PostedRecv> posted_;
  std::vector<size_t> recv_positions_;  // program positions of the receives, in order
  size_t next_recv_ = 0;                // index into recv_positions_ of the next to post
  std::deque<InFlight> pending_;                  // gradient buckets in flight, issue order
  StepTimes times_;
  std::string instr_times_dir_;  // $WEFT_INSTR_TIMES; empty: per-instruction timing off
  InstrTimes instr_times_;
  std::vector<int> loss_tensors_;  // table ids holding pieces of set_loss_values() values
  std::vector<char> writes_state_;  // per program position: the instruction changes state
  bool state_written_ = false;      // see state_written()
  // Per program position p (and one past the end): every instruction from p on needs no peer.
  std::vector<char> local_from_;
  // Where the last run_step stopped because its before_update threw (npos: it did not),
  // and that step's scalars, for finish_step.
  static constexpr size_t kNotPaused = size_t(-1);
  size_t paused_at_ = kNotPaused;
  core::StepScalars paused_scalars_;
  int norm_value_ = -1;            // the grad_norm value
  double last_norm_ = 0;
};

}  // namespace weft::parallel
