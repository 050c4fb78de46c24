// The multi-rank training loop, one world at a time (train_ranks.h).
#include "launch/train_ranks.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "checkpoint/parallel_state.h"
#include "checkpoint/snapshot_views.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "core/graph/moe_balance.h"
#include "core/io/loss_plot.h"
#include "core/io/metrics.h"
#include "core/io/safetensors.h"
#include "launch/elastic_worker.h"
#include "launch/epoch_notice.h"
#include "launch/epoch_world.h"
#include "launch/heartbeat.h"
#include "launch/job_cost_model.h"
#include "launch/live_resize.h"
#include "launch/live_resize_prefault.h"
#include "launch/nonfinite_guard.h"
#include "launch/rank_snapshots.h"
#include "launch/roll_forward.h"
#include "launch/run_folder.h"
#include "launch/snapshot_rewrite_for_tests.h"
#include "launch/train_common.h"
#include "launch/train_report.h"
#include "launch/world_ahead.h"
#include "memory/recycling_allocator.h"
#include "parallel/trainer.h"
#include "planner/memory_estimate.h"
#include "planner/plan_cache.h"
#include "planner/planner.h"
#include "planner/policy.h"

namespace weft::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// weft run starts every rank on this node (standalone); mpirun says how many it placed here.
int ranks_on_node(const parallel::LaunchEnv& env) {
  return int(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env.world));
}

// How one world's training ended.
enum class WorldEnd {
  kDone,     // train.steps reached
  kStopped,  // Ctrl-C or SIGTERM on some rank: every rank stopped after the same step
  kChange,   // a newer epoch: every rank stopped after the same step, state whole
  kFailed,   // a collective failed (a member died): the state is whole unless torn
};

// Where the state of a world came from, and the clock of the change that led to it.
struct Arrival {
  std::string source;  // "survivors" | "snapshots" | "checkpoint" | "seed" | "first"
  int holders = 0;
  int snapshots = 0;  // of the holders, old ranks restored from in-memory snapshots
  int replicas = 0, rebuilt = 0;  // of those, copies from another node, rebuilt from parity
  int64_t went_back = 0;  // steps redone: the held step minus the step resumed at
  int64_t bytes_sent = 0;     // between ranks, all ranks together: the minimum
  int64_t bytes_adopted = 0;  // this rank's: kept in place (no copy)
  int64_t bytes_local = 0;    // this rank's: copied within the rank
  double wait = 0, comms = 0, plan = 0, fetch = 0, transfer = 0, resume = 0;
  // Of `transfer`, the router's shared-memory setup: collective, so it lasts until the last
  // rank reached the move (the others' reserve waits show here, not as bytes moving).
  double transfer_setup = 0;
  bool comms_ahead = false;  // the world was connected while the old one ended its step
  int splits_ahead = 0;       // and that many splits of it (trainers' part, process groups)
  // This rank's old state went to the router as the only handles, freed as it moved: a
  // snapshot of the same step backs it (snapshot_backs), or elastic.old_state asks for it.
  bool freed_as_moved = false, backed = false;
  // The holders' pieces were of several layouts of one step (choose_holders' `mixed`): what
  // an earlier move, stopped midway by this epoch, left on each rank.
  bool mixed = false;
  // Ranks behind that finished their step with the records of a rank ahead (roll_forward.h),
  // and the step they then held.
  int rolled = 0;
  int64_t rolled_to = -1;
};

std::string rolled_note(const Arrival& a) {
  if (a.rolled == 0) return "";
  return str("; ", a.rolled, " rank", a.rolled == 1 ? "" : "s",
             " behind (the member died during the statistics exchange) rolled forward to step ",
             a.rolled_to, ", finishing the step with the statistics of the ranks ahead");
}

// The part of the transfer phase that waited for the last rank to reach the move: a rate
// over the transfer phase alone would count another rank's reserve as slow bytes.
std::string setup_note(const Arrival& a) {
  if (a.transfer_setup < 0.005) return "";
  char b[96];
  std::snprintf(b, sizeof b, "; of the transfer, %.2f s until the last rank reached the move",
                a.transfer_setup);
  return b;
}

// What was connected while the old world ended its step: the world, and with it the
// trainers' part and process groups (`groups_given`: the trainer took them).
std::string ahead_note(const Arrival& a, bool groups_given) {
  if (!a.comms_ahead) return "";
  std::string s = "; its communicator was connected while the old world ended its step";
  if (groups_given)
    s += str(", its process groups too (", a.splits_ahead, " split", a.splits_ahead == 1 ? "" : "s",
             ")");
  return s;
}

std::string mixed_note(const Arrival& a) {
  return a.mixed ? "; a move that this epoch stopped midway left the state in pieces of the old "
                   "and the new layout, of this step"
                 : "";
}

std::string freed_note(const Arrival& a) {
  if (!a.freed_as_moved) return "";
  return a.backed ? "; rank 0 freed its old state as it moved, a snapshot of the same step "
                    "backing it"
                  : "; rank 0 freed its old state as it moved (elastic.old_state: "
                    "free_as_moved; no snapshot of this step backs it)";
}

// How long any wait on a peer may take (a world's connect, a collective).
comm::Millis comm_timeout() { return comm::Millis(env_int("WEFT_COMM_TIMEOUT_MS", 60'000)); }

// Named wall-time laps of one world entry, finer than the resize line's phases: logged with
// WEFT_LOG_LEVEL=debug WEFT_LOG_SUBSYS=resize.
class Laps {
 public:
  void lap(const char* name) {
    const Clock::time_point now = Clock::now();
    add(name, std::chrono::duration<double>(now - t_).count());
    t_ = now;
  }
  void add(const std::string& name, double s) {
    text_ += str(text_.empty() ? "" : ", ", name, " ", ms(s));
  }
  const std::string& text() const { return text_; }

 private:
  static std::string ms(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", s * 1e3);
    return b;
  }
  Clock::time_point t_ = Clock::now();
  std::string text_;
};

// Where restored snapshots came from: "2 own, 1 replica" (own: the node's agent that took
// it; replica: a copy another node's agent holds; rebuilt: decoded from parity).
std::string snapshot_origins(const Arrival& a) {
  std::string s = str(a.snapshots - a.replicas - a.rebuilt, " own");
  if (a.replicas) s += str(", ", a.replicas, " replica", a.replicas == 1 ? "" : "s");
  if (a.rebuilt) s += str(", ", a.rebuilt, " rebuilt from parity");
  return s;
}

// The summary's steps and validations from a metrics file (the lines kept so far).
TrainReport report_from(const std::string& metrics, const core::JobSpec& spec) {
  TrainReport r(spec);
  for (const core::io::MetricsRow& row : core::io::read_metrics(metrics)) {
    if (row.is_validation()) {
      r.add_validation(int64_t(row.at("step")), row.at("val_loss"));
      continue;
    }
    core::io::StepMetrics m;
    m.step = int64_t(row.at("step"));
    m.loss = row.at("loss");
    m.lr = row.at("lr");
    m.grad_norm = row.at("grad_norm");
    m.tokens_per_s = row.at("tokens_per_s");
    m.world = int64_t(row.get("world").value_or(1));
    m.epoch = int64_t(row.get("epoch").value_or(0));
    r.add_step(m);
  }
  return r;
}

class RankTraining {
 public:
  RankTraining(const Args& args, const core::JobSpec& spec, const parallel::LaunchEnv& env)
      : args_(args),
        job_(spec),
        spec_(spec),
        base_(env),
        env_(env),
        data_(core::data::TokenDataset::load(spec)),
        live_(spec.elastic.on_change == "reshard" && env.launcher == "weft run" &&
              !env_string(kEpochFileVar, "").empty()),
        watch_(live_ ? env_string(kEpochFileVar, "") : "", env.rdzv_epoch),
        report_(spec),
        guard_(spec.train),
        plans_(spec, [this] { return job_cost_model(); }),
        space_(parallel::StateSpace::from_graph(plans_.graph()->graph,
                                                core::MoeBalance::for_model(spec.model).get())),
        snaps_(spec, env),
        node_(int(env_int("GROUP_RANK", 0))),
        train_world_(env.world) {}

  int run();

 private:
  void enter_world(const std::string& why);
  void enter_next_world(std::string why);
  WorldEnd train_world();
  // One step and what follows it (metrics, checkpoint, validation, the step-end agreement);
  // nullopt when the world goes on.
  std::optional<WorldEnd> one_step();
  void validate(bool last);
  void open_run_folder();
  int finish(bool stop);
  int leave_job();
  // Waits for the agent's notice of an epoch later than the one this worker is in.
  EpochNotice wait_for_notice();
  // A parked spare's worker (elastic_worker.h): prepares its likely place, then waits for
  // the notice of the epoch it enters as a newcomer; nullopt when stopped unadmitted.
  std::optional<EpochNotice> park();
  void print_arrival(const std::string& why, int old_world, int64_t old_epoch);
  // From the moment a change is known, the next world's destinations faulted in
  // (prefault_): that of `notice` (nullptr: the nearest likely one), for a rank holding
  // state tensors of `held` bytes; at a notice, beside the step, also the persistent blocks
  // of `freed` bytes that it frees at the step's end (its gradients; after a failure, those
  // of a step it holds unfinished): those the next layout takes back are not faulted anew
  // (RecyclingAllocator::reserve's `returning`).
  void prefault_ahead(const EpochNotice* notice, const std::vector<size_t>& held,
                      const std::vector<size_t>& freed = {});
  // The world sizes a change most likely leads to next, nearest first (plan_ahead).
  std::vector<int> likely_next_worlds() const;
  // Connections per pair for the router's transfers between hosts (elastic.transfer_connections;
  // one where no state moves live).
  int transfer_connections() const { return live_ ? int(job_.elastic.transfer_connections) : 1; }
  // Tests only: the transfer's progress hook that stops a move midway (WEFT_TEST_STALL_MOVE).
  std::function<void(const parallel::TransitionStats&)> stall_for_tests(
      int64_t epoch, const parallel::TransferPlan& plan, const parallel::Layout& a,
      const parallel::Layout& b);
  // Tests only: the trainer's after-exchange hook that splits a step (WEFT_TEST_SPLIT_EXCHANGE).
  std::function<void()> split_exchange_for_tests();
  // The job's cost model (job_cost_model.h), asked by the first plan this process makes:
  // through the store of the world it enters (or, parked, of the job's rendezvous).
  planner::CostModel job_cost_model();
  // A survivor entering an epoch whose store is not the one it got the model from (an etcd
  // job's new node 0 serves a new one): publishes the job's model there for the joiners.
  void republish_job_cost_model();
  // Finishes this rank's stopped step when `roll` says so (its state is then that of the
  // step after), and drops the trainer kept for it either way.
  void finish_behind(const RollForward& roll);

  const Args& args_;
  const core::JobSpec& job_;  // as the job file gives it
  // This world's: job_ with the layout that fits it (planner::fit_layout; job_ itself
  // unless elastic.layout: auto had to change degrees).
  core::JobSpec spec_;
  const parallel::LaunchEnv base_;
  parallel::LaunchEnv env_;  // this world's
  core::data::TokenDataset data_;
  const bool live_;
  EpochWatch watch_;
  TrainReport report_;
  NonfiniteGuard guard_;
  // Before everything that holds tensors or plans: those must go first.
  // Every world size's plan, made once in this process (and the likely next ones ahead).
  planner::PlanCache plans_;
  const parallel::StateSpace space_;  // the state's coordinates, the same in every world
  // The trainers' persistent tensors: a new world's trainer takes back the blocks the last
  // one freed (its gradients, for a data-parallel change), kept until the world is entered.
  memory::RecyclingAllocator persistent_;
  DestinationPrefault prefault_{persistent_};  // faults persistent_'s next blocks in ahead
  // Frees a live state the new world does not take, beside the snapshot reads (enter_world):
  // its munmaps wait for the prefault's populate between pieces (the mmap lock), 45-100 ms
  // of the entry on the thread that reads. Joined before the prefault is waited for.
  std::jthread dropping_;

  WorldAhead ahead_;  // the next epoch's world, connected while this one ends its step
  std::unique_ptr<parallel::WorkerWorld> world_;
  std::unique_ptr<parallel::ParallelTrainer> trainer_;
  // The last world's trainer when its step stopped right before the update with a local rest
  // (HeldState::unfinished): kept, its world gone, until the next world's entry has decided
  // whether it finishes the step (finish_behind).
  std::unique_ptr<parallel::ParallelTrainer> behind_;
  std::unique_ptr<checkpoint::ParallelCheckpoints> ckpt_;
  std::unique_ptr<core::Trainer> evaluator_;  // rank 0, for validation
  std::optional<RunFolder> folder_;
  std::unique_ptr<core::io::MetricsWriter> metrics_;
  // The job's cost model as published (JobCostModel::text) once known, and the store
  // ("host:port") it was read from or last published in.
  std::optional<std::string> job_model_text_;
  std::string job_model_used_, job_model_store_;
  bool parked_now_ = false;  // park(): the store may not answer (etcd), so do not wait on it
  HeldState held_;
  RankSnapshots snaps_;
  int node_ = 0;  // this node's index in the epoch (GROUP_RANK, then the notices')
  Arrival arrival_;
  bool first_world_ = true;
  bool first_step_of_world_ = false;
  double resize_s_ = 0;  // change known -> ready to step, for the first step's metrics line
  int64_t steps_in_world_ = 0;  // steps this rank ran in its current world (the debug step line)
  // The metrics line of the last step whose statistics every rank agreed on (this rank's
  // timings), kept across worlds: see write_agreed_line.
  std::optional<core::io::StepMetrics> agreed_line_;
  void keep_agreed_line();
  void write_agreed_line();
  core::io::StepMetrics step_line(const core::StepStats& st, double secs,
                                  std::vector<std::pair<std::string, double>> extra) const;
  Clock::time_point change_at_;
  int64_t saved_at_ = 0;
  double total_s_ = 0;
  // The ranks of this world that train: all of env_.world, except in the first world of an
  // epoch that nodes left gracefully, whose workers (ranks train_world_ and up) only hand
  // their state over and end (leaving_ on those).
  int train_world_ = 0;
  bool leaving_ = false;
  std::unique_ptr<comm::Communicator> train_comm_;  // the trainers' part, when some leave
  void adopt_notice(const EpochNotice& n) {
    watch_.adopt(n);
    env_ = env_in_epoch(base_, n);
    train_world_ = n.world();
    leaving_ = n.leave;
    node_ = n.node_index;
    // A worker's first world is of the epoch it entered (a parked worker's had none): its
    // run folder and metrics continue the job's, as those of a worker started in it do.
    if (first_world_ && n.restart_count >= 0) env_.restart_count = n.restart_count;
  }
  bool lead() const { return env_.rank == 0; }
  // The trainers of a world of `world` training ranks: their plan from plans_ (made ahead,
  // usually), for the process groups connected with the world.
  EpochTrainers trainers_of(int world) {
    return {world, [this, world] { return plans_.plan(world); }};
  }
  // This node's workers (weft run's --nproc-per-node).
  int local_count() const { return int(env_int("LOCAL_WORLD_SIZE", 1)); }
};

// The state this world starts from: the survivors' through the router when they hold all of
// it, else the latest checkpoint, else the seed.
void RankTraining::enter_world(const std::string& why) {
  const int old_world = held_.world;
  const int64_t old_epoch = held_.epoch;
  arrival_ = Arrival{};
  arrival_.wait = first_world_ ? 0 : since(change_at_);
  auto t = Clock::now();
  Laps laps;
  // Before anything waits on a peer: a joiner of this epoch may be waiting for the model.
  republish_job_cost_model();
  // Degrees that no longer fit the world stop the job here, naming them.
  std::string refit;
  spec_ = planner::fit_layout(job_, train_world_, &refit);
  if (lead() && !refit.empty()) {
    std::printf("weft train: elastic.layout: auto: the job's degrees do not fit a world of %d; "
                "training it as %s\n",
                train_world_, refit.c_str());
    std::fflush(stdout);
  }
  planner::check_fits_memory(spec_, train_world_, ranks_on_node(env_));
  laps.lap("fits");
  // A worker that holds nothing after the job's first epoch (a newcomer, a torn rank)
  // receives all of its state: it faults the pages of its state and gradients in while the
  // world forms (the survivors are finishing their step meanwhile), so that the transfer
  // writes into memory that exists. A survivor started faulting in what it guessed its
  // next layout allocates when the change became known (prefault_ahead): the same sizes go
  // on; a different outcome trims that reserve to this world's sizes (its destinations are
  // then faulted as the router writes them). Waited for before the trainer allocates: the
  // allocator would serve its blocks as they land, but letting the router fault the rest
  // beside it on the same cores measured slower (node-loss bench: 0.23-0.24 s of transfer
  // against 0.15-0.16 s plus a 10-84 ms wait). Not in the first epoch: every rank seeds
  // then, and nobody waits for anybody long enough to hide it.
  if (live_ && env_.rdzv_epoch > 1) {
    if (leaving_) {
      prefault_.expect({});  // a departing rank allocates nothing
    } else {
      std::vector<size_t> sizes = sizes_to_fault(*plans_.plan(train_world_), env_.rank, held_);
      if (!held_.valid) prefault_.start(std::move(sizes), SIZE_MAX);
      else prefault_.expect(std::move(sizes));
    }
    laps.lap("plan, prefault started");
  }
  std::function<std::string()> superseded;
  if (live_)
    superseded = [this] {
      std::optional<EpochNotice> n = watch_.newer();
      return n ? str("epoch ", env_.rdzv_epoch, " was replaced by epoch ", n->epoch,
                     " before its world formed")
               : std::string();
    };
  // The world, the trainers' part of it and their process groups of this world's plan
  // (epoch_world.h), connected ahead while the old world ended its step, or here: the same
  // splits in the same order on every rank either way.
  std::unique_ptr<EpochWorld> ew = live_ && !first_world_ ? ahead_.take(env_.rdzv_epoch) : nullptr;
  arrival_.comms_ahead = ew != nullptr;
  if (!ew)
    ew = std::make_unique<EpochWorld>(connect_epoch_world(
        env_, trainers_of(train_world_), comm_timeout(), superseded, transfer_connections()));
  arrival_.splits_ahead = arrival_.comms_ahead ? ew->splits() : 0;
  train_comm_.reset();
  world_ = std::move(ew->world);
  train_comm_ = std::move(ew->train_comm);
  std::unique_ptr<parallel::ProcessGroups> groups = std::move(ew->groups);
  ew.reset();
  comm::Communicator& comm = world_->comm();
  comm::Communicator* tc = train_comm_ ? train_comm_.get() : &comm;
  laps.lap(arrival_.comms_ahead ? "world and groups (ahead)" : "world and groups");
  // Until this world trains, a newer epoch ends it: some of its ranks will never come.
  std::optional<LossWatcher> entering;
  if (live_) {
    std::vector<comm::Communicator*> comms = world_->connections();  // the router's stripes too
    comms.insert(comms.begin(), &comm);
    entering.emplace(watch_, comms, true);
  }
  if (live_ && !folder_) open_run_folder();  // every rank, before rank 0 writes anything
  // What every rank holds: its live state (live only) and the snapshots of its node's agent.
  const bool gather = live_ || snaps_.enabled();
  std::vector<HolderReport> reports;
  if (gather) {
    const std::vector<HolderReport> offers =
        snaps_.offers(env_.local_rank, local_count(), env_.rdzv_epoch);
    laps.lap("offers");
    reports = exchange_reports(comm, held_, host_key(), offers);
    laps.lap("reports");
    finish_behind(roll_forward(plans_, space_, reports, env_.world, comm, held_));
    laps.lap("roll forward");
  }
  behind_.reset();
  int64_t latest = -1;  // the latest step anybody alive holds
  for (int r = 0; r < int(reports.size()) && r < env_.world; ++r)
    if (reports[size_t(r)].valid) latest = std::max(latest, reports[size_t(r)].step);
  arrival_.comms = since(t);
  t = Clock::now();

  // A survivor whose live state the world's choice of holders does not take (a node loss
  // goes back to an older step's snapshots, which no vote of choose_and_read undoes: the live
  // pieces of a later step never cover) drops it now, where the move would free it anyway,
  // on a thread of its own beside the snapshot reads (dropping_): its blocks become the
  // allocator's spares, which the reserve (and then the router) reshapes into this world's
  // sizes instead of faulting those in anew (memory::RecyclingAllocator). As after the move,
  // it then holds nothing of the old world.
  if (gather && held_.valid && !leaving_) {
    const Holders first = choose_holders(plans_, space_, reports, env_.world);
    bool taken = false;
    for (const Holders::Part& part : first.parts)
      taken = taken || (part.holder == env_.rank &&
                        reports[size_t(part.report)].source == HolderReport::kLive);
    arrival_.backed = snapshot_backs(held_, reports);
    if (first.found && !taken &&
        (arrival_.backed || spec_.elastic.old_state == "free_as_moved")) {
      const int held_rank = held_.rank, held_world = held_.world;
      dropping_ = std::jthread([old = std::move(held_)]() mutable { old = HeldState{}; });
      held_ = HeldState{};
      held_.rank = held_rank, held_.world = held_world;
      laps.lap("state not chosen dropped");
    }
  }
  // The coordinates of the state, the same for every world of the job (space_), and the
  // plans, each world size's made once in this process (plans_).
  const parallel::StateSpace& space = space_;
  Holders holders;
  // The chosen snapshots this rank serves, read and verified while the world chooses: a
  // corrupt one is voted out and the world chooses again (choose_and_read).
  std::map<int, std::vector<core::Tensor>> read_parts;
  double read_s = 0;  // the choice with its reads and votes: the resize line's read snapshots
  if (gather) {
    const Clock::time_point t_read = Clock::now();
    std::vector<std::string> notes;
    holders = choose_and_read(
        plans_, space, reports, env_.world, comm,
        [this](const HolderReport& r, const Holders::Part& p, int64_t step) {
          return snaps_.read(int(r.rank), step, p.layout);
        },
        read_parts, &notes);
    // With the wait in the vote for the ranks that read more (the router would wait for them
    // otherwise); choosing alone takes milliseconds.
    if (holders.snapshots > 0) read_s = since(t_read);
    for (const std::string& n : notes)
      if (lead()) std::printf("weft train: %s\n", n.c_str());
    std::fflush(stdout);
  }
  laps.lap("holders and snapshot reads");
  // The line of the step before the state's, for a lead that kept none of it; written
  // below (write_agreed_line) when the metrics file lacks it.
  if (holders.found) agreed_line_ = share_agreed_line(comm, agreed_line_, holders.step - 1);
  std::string resume;
  if (holders.found) {
    arrival_.source = holders.snapshots > 0 ? "snapshots" : "survivors";
    arrival_.holders = holders.count();
    arrival_.snapshots = holders.snapshots;
    arrival_.replicas = holders.replicas;
    arrival_.rebuilt = holders.rebuilt;
    arrival_.mixed = holders.mixed;
  } else {
    if (gather && !first_world_)  // which box nobody holds (the resize line says the outcome)
      WEFT_DEBUG("resize", "rank ", env_.rank, ": no holders cover the state: ", holders.why_not);
    // The first world: --resume, or after a restart of the whole job the latest checkpoint.
    // A later one: the latest checkpoint, since nobody alive holds all of the state.
    parallel::LaunchEnv e = env_;
    if (!first_world_) e.restart_count = std::max(1, e.restart_count);
    resume = resume_source(spec_, e, first_world_ ? args_.get_or("--resume", "") : "");
    arrival_.source = !resume.empty() ? "checkpoint" : first_world_ ? "first" : "seed";
  }
  const parallel::StateInit init = holders.found  ? parallel::StateInit::kDeferred
                                   : resume.empty() ? parallel::StateInit::kSeed
                                                    : parallel::StateInit::kUnseeded;
  if (dropping_.joinable()) {
    dropping_.join();
    laps.lap("dropped state freed");
  }
  if (prefault_.started()) {
    const size_t ahead = prefault_.wait();
    laps.lap("prefault wait");
    WEFT_DEBUG("resize", "rank ", env_.rank, ": ", mib(ahead),
               " MiB of this world's blocks faulted in ahead (", persistent_.reshaped(),
               " blocks of an old layout reshaped into new sizes so far in this process)");
  }
  // Cached: made for an earlier world of this size, or ahead (plan_ahead below).
  const bool ready = plans_.has(train_world_);
  const std::shared_ptr<const planner::Plan> new_plan = plans_.plan(train_world_);
  laps.lap(ready ? "plan (cached)" : "plan");
  WEFT_DEBUG("planner", "rank ", env_.rank, ": world of ", train_world_, " ranks plans under ",
             job_model_used_, ": plan ", plan_fingerprint(*new_plan));
  if (!leaving_) {
    trainer_ = std::make_unique<parallel::ParallelTrainer>(
        spec_, *tc, init,
        parallel::TrainerParts{plans_.graph(), new_plan, &persistent_, std::move(groups)});
    trainer_->set_after_exchange(split_exchange_for_tests());
  }
  laps.lap("trainer");
  if (trainer_) {
    const parallel::TrainerSetupTimes& st = trainer_->setup_times();
    laps.add("of which trainer check", st.graph + st.plan + st.check);
    laps.add(trainer_->groups_given() ? "trainer groups (given)" : "trainer groups", st.groups);
    laps.add("trainer executor", st.executor);
    laps.add("trainer init", st.init);
  }
  if (holders.found) {
    // Layout B over the transition's world: the new plan's ranks, then the departing ones,
    // which hold nothing in it.
    const std::vector<int> hosts = host_ids(reports, env_.world);
    parallel::Layout b =
        parallel::layout_of(space, *new_plan, {hosts.begin(), hosts.begin() + train_world_});
    b.ranks.resize(size_t(env_.world));
    b.hosts = hosts;
    // WEFT_ROUTER_BUDGET_BYTES: the router's memory budget per rank (router.h; the same on
    // every rank), 256 MiB by default; tests make it small for moves of many waves.
    parallel::RouterOptions budget;
    budget.budget_bytes = env_int("WEFT_ROUTER_BUDGET_BYTES", budget.budget_bytes);
    const parallel::TransferPlan plan = parallel::transition(space, holders.a, b, budget);
    laps.lap("transition");
    arrival_.plan = since(t) - read_s;
    t = Clock::now();
    // The live state's handles. By default (elastic.old_state: free_as_moved) the router
    // takes the only ones and frees each source once it has moved, so a reshape peaks at the
    // larger holding plus the router's budget, not at old plus new. A newer epoch may abort
    // the entry midway (on every rank at once: the entering LossWatcher): each rank then holds
    // what it had not yet freed and what had arrived (held_after_move: whole tensors, and
    // the arrived boxes of partly filled ones, router.h's Arrived), pieces of two
    // layouts of this one step, and the next world takes the state from those (choose_holders
    // covers from pieces of any layouts), redoing nothing. keep_unless_backed keeps copies in
    // held_ until the world is entered (old plus new), unless same-step snapshots back it:
    // that also survives a rank lost during the move, which takes the only copy of what it
    // had received.
    arrival_.backed = arrival_.backed || snapshot_backs(held_, reports);  // (dropped above)
    // A departing rank keeps its state whole until its hand-over is confirmed: it allocates
    // nothing of the new layout, and a later epoch may need the state again from it.
    const bool free_old =
        !leaving_ && (arrival_.backed || spec_.elastic.old_state == "free_as_moved");
    std::vector<core::Tensor> src;
    for (const Holders::Part& part : holders.parts) {
      if (part.holder != env_.rank) continue;
      const HolderReport& from = reports[size_t(part.report)];
      std::vector<core::Tensor> t;
      if (from.source != HolderReport::kLive) {
        t = std::move(read_parts.at(part.report));
      } else {
        std::vector<core::Tensor>& mine = held_.pieces.at(size_t(from.piece)).tensors;
        t = free_old ? std::move(mine) : mine;
        arrival_.freed_as_moved = free_old;
      }
      src.insert(src.end(), std::make_move_iterator(t.begin()), std::make_move_iterator(t.end()));
    }
    // Snapshot parts read in place: the router counts them as held, but their bytes are the
    // agent's shared memory, mapped, not this process's (the debug line below says so).
    int64_t view_bytes = 0;
    for (const core::Tensor& x : src)
      if (x.defined() && checkpoint::is_snapshot_view(x)) view_bytes += int64_t(x.nbytes());
    // From here on the router holds the only handles (pieces outside the chosen group go
    // now: older than it, or incomplete); what is left of them if the move stops midway is
    // held again below.
    const int held_rank = held_.rank, held_world = held_.world;
    const int64_t kept_bytes = free_old ? 0 : held_.bytes();
    if (free_old) {
      held_ = HeldState{};
      held_.rank = held_rank, held_.world = held_world;
    }
    // Reading the snapshots this rank serves (mapping in, memcpy + checksums), done while the
    // holders were chosen.
    arrival_.fetch = since(t) + read_s;
    laps.lap("fetch");
    t = Clock::now();
    // Same-host pairs move through shared memory; survivors keep (adopt) what they hold.
    parallel::TransitionStats ts;
    parallel::TransitionOptions to;
    to.destinations = &persistent_;  // the blocks reserved ahead (prefault), or new ones
    to.on_progress = stall_for_tests(env_.rdzv_epoch, plan, holders.a, b);
    if (auto rewrite = snapshot_rewrite_for_tests(
            env_.rdzv_epoch, env_.store_prefix.ends_with("/round/0"), env_.rank, snaps_.offered()))
      to.on_progress = [rewrite, stall = to.on_progress](const parallel::TransitionStats& st) {
        rewrite(st);
        if (stall) stall(st);
      };
    to.connections = world_->connections();  // elastic.transfer_connections, across hosts
    parallel::Arrived arrived;
    std::vector<core::Tensor> mine;
    try {
      mine = parallel::run_transition(plan, holders.a, b, env_.rank, src, comm, to, &ts, &arrived);
      // Snapshot parts are read-only views of their slots: one the router adopted whole is
      // copied out here.
      snaps_.own(mine, &persistent_);
    } catch (const CommError&) {
      snaps_.own(arrived.tensors, &persistent_);
      snaps_.check_unchanged(nullptr);  // the move's connections may be gone: its own slots
      if (free_old) {
        held_ = held_after_move(holders, reports, env_.rank, src, arrived, train_world_,
                                env_.rank);
        held_.rank = held_rank, held_.world = held_world;
      }
      size_t partial = 0;  // boxes of destinations that arrived in part
      for (const HeldPiece& p : held_.pieces) partial += p.partial.size();
      WEFT_DEBUG("resize", "rank ", env_.rank, ": the move stopped midway; it holds ",
                 held_.pieces.size(), " pieces (", mib(size_t(held_.bytes())), " MiB; ", partial,
                 " boxes of tensors that arrived in part)");
      throw;
    }
    // A slot rewritten during the move stops the entry on every rank: its bytes went to
    // other ranks too (rank_snapshots.h). (The choice of holders is the same everywhere.)
    if (holders.snapshots > 0) snaps_.check_unchanged(&comm);
    // The most this rank held in state during the move (tensors and staging): the router's
    // count when it held the only handles; else the old state whole plus all it allocated.
    WEFT_DEBUG("resize", "rank ", env_.rank, ": the move held at most ",
               mib(size_t(free_old ? ts.bytes_held_peak
                                   : kept_bytes + ts.bytes_allocated + ts.bytes_staging)),
               " MiB of state (", mib(size_t(ts.bytes_held_start)), " MiB before, ",
               mib(size_t(ts.bytes_adopted + ts.bytes_allocated)), " MiB after; ",
               free_old ? "the old state freed as it moved" : "the old state kept whole",
               view_bytes > 0 ? str("; the counts include ", mib(size_t(view_bytes)),
                                    " MiB of snapshot slots read in place: the agent's shared "
                                    "memory, mapped, not this process's")
                              : std::string(),
               ")");
    // Moved: until this world is entered, what the rank holds is the new layout's state of
    // this step (an entry that fails from here on leaves it to the next world).
    if (free_old && !leaving_) {
      HeldState moved;
      moved.valid = true;
      moved.epoch = holders.epoch, moved.step = holders.step;
      moved.rank = held_rank, moved.world = held_world;
      moved.pieces.push_back(HeldPiece{env_.rank, train_world_, {}, mine});
      held_ = std::move(moved);
    }
    arrival_.bytes_sent = plan.bytes_remote();
    arrival_.bytes_adopted = ts.bytes_adopted;
    arrival_.bytes_local = ts.bytes_copied;
    // With departing ranks, every rank waits here until all have what they need: only then
    // may a departing node confirm its hand-over and go. A rank lost before this point makes
    // the next epoch, which still lists the departing nodes, take their state again.
    if (env_.world > train_world_) comm.barrier().wait();
    arrival_.transfer = since(t);
    arrival_.transfer_setup = ts.seconds_setup;
    t = Clock::now();
    laps.lap("transfer");
    if (leaving_) {
      WEFT_DEBUG("resize", "epoch ", env_.rdzv_epoch, " entry: ", laps.text());
      return;  // handed over: run() ends this worker
    }
    trainer_->adopt_state(space, b.ranks[size_t(env_.rank)], mine);
  } else {
    arrival_.plan = since(t);
    t = Clock::now();
  }
  if (leaving_) return;  // nobody can use its state: the others resume from a checkpoint
  if (first_world_ && args_.has("--init-weights") && resume.empty())
    trainer_->load_weights(core::io::load_safetensors(args_.get("--init-weights"), "--init-weights"),
                           "--init-weights");
  if (lead() && first_world_ && !holders.found) print_attempt(spec_, env_, resume);
  // A new worker that leads (a replaced rank 0, a newcomer node's) and got the survivors'
  // live state: no snapshot was read, so not the restart line below.
  if (lead() && first_world_ && holders.found && holders.snapshots == 0)
    std::printf("weft train: rank 0 is a new worker (membership epoch %lld, world %d): state of "
                "step %lld from %d holders through the router, %.1f MiB between ranks\n",
                (long long)env_.rdzv_epoch, env_.world, (long long)trainer_->current_step(),
                holders.count(), mib(size_t(arrival_.bytes_sent)));
  if (lead() && first_world_ && holders.found && holders.snapshots > 0) {
    std::printf("weft train: restart %d (membership epoch %lld, world %d): resumed at step %lld "
                "from the in-memory snapshots of %d rank%s (world %d, epoch %lld; %s) through the "
                "router, %.1f MiB between ranks; no checkpoint read; ready in %.2f s (communicators %.2f, "
                "plan %.2f, read snapshots %.2f, transfer %.2f, resume %.2f)\n",
                env_.restart_count, (long long)env_.rdzv_epoch, env_.world,
                (long long)trainer_->current_step(), holders.snapshots,
                holders.snapshots == 1 ? "" : "s", holders.old_world, (long long)holders.epoch,
                snapshot_origins(arrival_).c_str(), mib(size_t(arrival_.bytes_sent)),
                arrival_.comms + arrival_.plan + arrival_.fetch + arrival_.transfer + arrival_.resume,
                arrival_.comms, arrival_.plan, arrival_.fetch, arrival_.transfer, arrival_.resume);
    std::fflush(stdout);
  }
  ckpt_ = std::make_unique<checkpoint::ParallelCheckpoints>(spec_, *trainer_, resume);
  saved_at_ = trainer_->current_step();
  if (latest >= 0) arrival_.went_back = latest - trainer_->current_step();
  snaps_.release_offers();
  if (snaps_.enabled())
    snaps_.attach(*trainer_, ckpt_->space(), env_.rdzv_epoch, node_, env_.local_rank, local_count(),
                  /*background=*/!first_world_ || holders.found);
  arrival_.resume = since(t);
  laps.lap("resume");
  WEFT_DEBUG("resize", "epoch ", env_.rdzv_epoch, " entry: ", laps.text());

  if (!folder_ && lead()) open_run_folder();  // live: every rank chose it above
  if (lead()) {
    // Whichever rank leads this world continues the metrics: lines of the steps it redoes
    // are dropped (a checkpoint older than the survivors' step), later ones appended.
    const bool continues = !first_world_ || continues_run(env_, args_.has("--resume"));
    metrics_ = open_metrics(*folder_, continues ? std::optional<int64_t>(trainer_->current_step())
                                                : std::nullopt);
    // A rank that becomes the lead, or a restarted one, takes over the run's history for its
    // summary (a restart's summary used to start at the step it resumed from).
    if (continues) {
      write_agreed_line();
      report_ = report_from(metrics_->path(), spec_);
    }
    if (first_world_) {
      fs::create_directories(folder_->out);
      std::ofstream(fs::path(folder_->out) / "config.yaml") << core::job_spec_to_yaml(job_);
      if (!folder_->note.empty()) std::printf("%s\n", folder_->note.c_str());
    }
  }
  if (!first_world_) print_arrival(why, old_world, old_epoch);
  const planner::Degrees& d = trainer_->plan().config.deg;
  if (lead() && first_world_) {
    std::printf(
        "weft train: %s, %lld layers, dim %lld, %.2fM parameters, %lld tokens (train); world %d = "
        "dp %lld x tp %lld x pp %lld x ep %lld (%s), zero %d, launched by %s%s\n",
        spec_.model.arch.c_str(), (long long)spec_.model.layers, (long long)spec_.model.dim,
        double(trainer_->num_parameters()) / 1e6, (long long)data_.train_tokens().size(),
        train_world_, (long long)d.dp, (long long)d.tp, (long long)d.pp, (long long)d.ep,
        trainer_->plan().config.schedule.c_str(), trainer_->plan().config.zero,
        env_.launcher.c_str(), live_ ? "; resizes reshard live" : "");
    std::fflush(stdout);
  }
  first_step_of_world_ = !first_world_;
  steps_in_world_ = 0;
  resize_s_ = first_world_ ? 0 : since(change_at_);
  first_world_ = false;
  held_ = HeldState{};  // entered: what the router did not adopt is released here
  prefault_.trim();     // and what the new trainer did not take back
  // The plans of the nearest node counts, made while this world trains.
  if (live_) plans_.plan_ahead(likely_next_worlds());
}

// WEFT_TEST_SPLIT_EXCHANGE=<step>:<victim>:<behind>, for tests of a member lost during a
// step's statistics exchange: in membership epoch 1, right after the exchange of step <step>
// returned, rank <victim> SIGKILLs itself and rank <behind> fails as if its piece of the
// exchange never came (the split a ring all-gather leaves when its member dies midway, made
// reproducible: every other rank got everything and runs its update). Unset: no hook.
std::function<void()> RankTraining::split_exchange_for_tests() {
  const std::string v = env_string("WEFT_TEST_SPLIT_EXCHANGE", "");
  if (v.empty() || env_.rdzv_epoch != 1) return {};
  long long step = -1;
  int victim = -1, behind = -1;
  if (std::sscanf(v.c_str(), "%lld:%d:%d", &step, &victim, &behind) != 3)
    throw ConfigError("WEFT_TEST_SPLIT_EXCHANGE",
                      "expected <step>:<victim rank>:<behind rank>, got '" + v + "'");
  if (env_.rank != victim && env_.rank != behind) return {};
  parallel::ParallelTrainer* t = trainer_.get();
  const bool die = env_.rank == victim;
  return [t, step, die] {
    if (t->current_step() != step) return;
    if (die) ::kill(::getpid(), SIGKILL);
    throw CommError(str("rank ", t->rank(), ": the statistics exchange of step ", step,
                        " lost a member (WEFT_TEST_SPLIT_EXCHANGE)"));
  };
}

void RankTraining::finish_behind(const RollForward& roll) {
  if (roll.step >= 0) {
    arrival_.rolled = int(roll.ranks.size());
    arrival_.rolled_to = roll.step + 1;
  }
  if (roll.mine) {
    WEFT_CHECK(behind_ && behind_->current_step() == roll.step, "rank ", env_.rank,
               " was told to finish step ", roll.step, " which it does not hold unfinished");
    const core::StepStats st = behind_->finish_step(roll.records);
    held_ = hold_state(*behind_, space_, held_.epoch, false);
    WEFT_DEBUG("resize", "rank ", env_.rank, ": finished step ", st.step,
               " with the records of rank ", roll.source, " (loss ", st.loss, ")");
  }
  behind_.reset();  // its gradients and activations: the state is in held_ now
}

// WEFT_TEST_STALL_MOVE=<epoch>:<percent>, for tests of a change during a move: in the entry
// of membership epoch <epoch>, once this rank's transfer has moved <percent> of its bytes in
// `plan` (copied, sent and received), it waits there until a newer epoch's notice has made
// the entering LossWatcher abort this world (at most WEFT_RESIZE_TIMEOUT_MS), once: the move
// stops midway on every rank. <epoch>:partial stops it instead right after the rank's first
// local copy into a tensor that other ranks send the rest of, and once the world is aborted
// fails there (a partly filled destination at the stop); a rank without one does not stop.
// Only in the epoch's first attempt (round 0): a restart round's world, every worker in it
// restarted, moves on. Unset (every real run): no hook.
std::function<void(const parallel::TransitionStats&)> RankTraining::stall_for_tests(
    int64_t epoch, const parallel::TransferPlan& plan, const parallel::Layout& a,
    const parallel::Layout& b) {
  const std::string v = env_string("WEFT_TEST_STALL_MOVE", "");
  const size_t colon = v.find(':');
  if (v.empty() || colon == std::string::npos || std::stoll(v.substr(0, colon)) != epoch ||
      !env_.store_prefix.ends_with("/round/0"))
    return {};
  int64_t bytes = 0;
  const bool partial = v.substr(colon + 1) == "partial";
  if (partial) {
    // Right after the first local copy into a destination that also receives from another
    // rank: partly filled at the stop (parallel::Arrived). The rank's counts then are its
    // local copies so far and every message of the earlier rounds (a wave's copies come
    // before its rounds). A rank without such a copy does not stop.
    const parallel::RankLayout& rb = b.ranks[size_t(env_.rank)];
    std::vector<char> remote(rb.locals.size(), 0);
    for (const parallel::Transfer& t : plan.transfers)
      if (t.dst == env_.rank && !t.local()) remote[size_t(rb.boxes[size_t(t.dst_box)].local)] = 1;
    const std::vector<int> adopt = parallel::adopted_locals(plan, a, b, env_.rank);
    int64_t moved = 0;
    for (const parallel::RankOp& op : parallel::rank_ops(plan, a, b, env_.rank)) {
      if (op.kind == parallel::RankOp::kSend || op.kind == parallel::RankOp::kRecv) {
        moved += op.bytes;
      } else if (op.kind == parallel::RankOp::kCopy) {
        const parallel::Transfer& t = plan.transfers[size_t(op.index)];
        const size_t l = size_t(rb.boxes[size_t(t.dst_box)].local);
        if (adopt[l] >= 0) continue;  // adopted: no copy
        moved += t.bytes;
        if (remote[l]) {
          bytes = moved;
          break;
        }
      }
    }
    if (bytes == 0) return {};
  } else {
    int64_t total = 0;
    for (const parallel::Transfer& t : plan.transfers)
      if (t.src == env_.rank || t.dst == env_.rank) total += t.bytes;
    bytes = total * std::stoll(v.substr(colon + 1)) / 100;
  }
  return [this, bytes, partial, done = false](const parallel::TransitionStats& st) mutable {
    const int64_t moved = st.bytes_copied + st.bytes_sent_shm + st.bytes_received_shm +
                          st.bytes_sent_comm + st.bytes_received_comm;
    if (done || moved < bytes) return;
    done = true;
    std::printf("weft train: rank %d: the move stops after %lld bytes until a newer epoch "
                "(WEFT_TEST_STALL_MOVE)\n",
                env_.rank, (long long)moved);
    std::fflush(stdout);
    // Until the entering LossWatcher has aborted this world: nothing moves after the stop.
    const auto limit = std::chrono::milliseconds(env_int("WEFT_RESIZE_TIMEOUT_MS", 120'000));
    const auto t0 = Clock::now();
    while (!world_->comm().aborted() && Clock::now() - t0 < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // `partial`: the move ends right here, its destination partly filled (returning would let
    // the shared-memory transfers go on until some wait failed, wherever that is).
    if (partial) throw CommError("the move was stopped by WEFT_TEST_STALL_MOVE");
  };
}

std::vector<int> RankTraining::likely_next_worlds() const {
  // Whole nodes join and leave: the nearest node counts first, within --nnodes MIN:MAX.
  const int per_node = std::max(1, local_count());
  const int nodes = train_world_ / per_node;
  const int lo = std::max(1, base_.nnodes_min), hi = base_.nnodes_max;
  std::vector<int> worlds;
  for (int d : {-1, 1, -2, 2})
    if (nodes + d >= lo && nodes + d <= hi) worlds.push_back((nodes + d) * per_node);
  return worlds;
}

// A survivor of a change (or a torn rank) faults in what its next layout allocates while the
// membership is agreed: that of the notice's world when the change came with one (a leave, a
// join), else of the nearest likely world, this rank's place there guessed as its own (a
// data-parallel neighbour's sizes are the same). A change that loses nobody starts it at its
// notice, beside the old world's last step (its watcher's thread), so that the ranks reach the
// move with their destinations in (the step's end is 0-2 s away); the step boundary then lets
// it go on within the larger bound. Within prefault_bound of what the rank holds (at the
// notice its gradients too, freed at the boundary; after a failure those of a step it holds
// unfinished, freed at the entry's roll forward), so the move's peak stays where it was.
// Only a plan made already (plan_ahead): a plan is not made twice at once on the 2 cores that
// training shares.
void RankTraining::prefault_ahead(const EpochNotice* notice, const std::vector<size_t>& held,
                                  const std::vector<size_t>& freed) {
  if (!live_) return;
  int world = 0, rank = env_.rank;
  if (notice) {
    if (notice->leave) return;
    world = notice->world();
    rank = env_in_epoch(base_, *notice).rank;
  } else {
    const std::vector<int> worlds = likely_next_worlds();
    if (worlds.empty()) return;
    world = worlds[0];
    rank = std::min(rank, world - 1);
  }
  if (world < 1 || rank < 0 || !plans_.has(world)) return;
  std::vector<size_t> sizes = sizes_to_fault(*plans_.plan(world), rank, held);
  const int64_t budget =
      env_int("WEFT_ROUTER_BUDGET_BYTES", parallel::RouterOptions{}.budget_bytes);
  int64_t state = 0, freeing = 0;
  for (size_t b : held) state += int64_t(b);
  for (size_t b : freed) freeing += int64_t(b);
  const size_t bound = prefault_bound(state, sizes, budget, state + freeing);
  if (!freed.empty() && prefault_.max_bytes() < bound)
    WEFT_DEBUG("resize", "rank ", env_.rank, ": the reserve for a world of ", world,
               notice ? str(" (epoch ", notice->epoch, ", from its notice)") : std::string(),
               " starts beside the trainer that still holds its gradients: up to ", mib(bound),
               " MiB (the ", mib(size_t(freeing)),
               " MiB of gradients freed before the move serve their sizes)");
  prefault_.start(std::move(sizes), bound, freed);
}

void RankTraining::print_arrival(const std::string& why, int old_world, int64_t old_epoch) {
  if (!lead()) return;
  const planner::Degrees& d = trainer_->plan().config.deg;
  const Arrival& a = arrival_;
  std::string from =
      a.source == "survivors"
          ? str("state from ", a.holders, " holder", a.holders == 1 ? "" : "s",
                " through the router (", mib(size_t(a.bytes_sent)), " MiB between ranks; rank 0 kept ",
                mib(size_t(a.bytes_adopted)), " MiB in place and copied ", mib(size_t(a.bytes_local)),
                " MiB", freed_note(a), mixed_note(a), ")")
      : a.source == "snapshots"
          ? str("nobody alive holds all of the state: resumed at step ", trainer_->current_step(),
                " (", a.went_back, " steps back) from ", a.holders, " holders, ", a.snapshots,
                " of them in-memory snapshots (", snapshot_origins(a), "), through the router (",
                mib(size_t(a.bytes_sent)),
                " MiB between ranks", freed_note(a), mixed_note(a), ")")
      : a.source == "checkpoint"
          ? str("nobody alive holds all of the state: resumed from the latest checkpoint at step ",
                trainer_->current_step(), ", ", a.went_back, " steps back")
          : str("nobody alive holds all of the state and there is no checkpoint: started over "
                "from step 0, ", a.went_back, " steps back");
  std::printf(
      "resize: epoch %lld -> %lld, world %d -> %d (dp %lld x tp %lld x pp %lld x ep %lld) at "
      "step %lld: %s; %s; training again %.2f s after the change (membership %.2f, "
      "communicators %.2f, plan %.2f, read snapshots %.2f, transfer %.2f, resume %.2f)%s\n",
      (long long)old_epoch, (long long)env_.rdzv_epoch, old_world, train_world_, (long long)d.dp,
      (long long)d.tp, (long long)d.pp, (long long)d.ep, (long long)trainer_->current_step(),
      why.c_str(), (from + rolled_note(a)).c_str(), since(change_at_), a.wait, a.comms, a.plan,
      a.fetch, a.transfer, a.resume,
      (setup_note(a) + ahead_note(a, trainer_->groups_given())).c_str());
  std::fflush(stdout);
}

void RankTraining::open_run_folder() {
  std::optional<int64_t> resumed;
  if (!first_world_ || continues_run(env_, args_.has("--resume")))
    resumed = trainer_ ? trainer_->current_step() : 0;
  folder_ = choose_run_folder(spec_.train.out_dir, args_.get_or("--metrics", ""), resumed);
}

void RankTraining::validate(bool last) {
  if (!data_.has_val() || spec_.train.eval_every <= 0 ||
      !(trainer_->current_step() % spec_.train.eval_every == 0 || last))
    return;
  // Validation runs on rank 0 from the gathered weights through the single-process
  // evaluator (the same numbers as `weft train` on one process); the plan has no
  // forward-only program yet.
  core::NamedTensors now = trainer_->gather_weights();  // collective
  if (!lead()) return;
  if (!evaluator_) {
    core::JobSpec one = spec_;
    one.parallel = core::ParallelSpec();
    evaluator_ = std::make_unique<core::Trainer>(one);
  }
  evaluator_->load_weights(now, "weights");
  // loss_free: the routing bias is state beside the weights (the same on every rank).
  if (trainer_->moe_balance() && evaluator_->moe_balance() &&
      trainer_->moe_balance()->mode() == core::MoeBalance::Mode::kLossFree)
    evaluator_->moe_balance()->copy_bias_from(*trainer_->moe_balance());
  auto val_batch = [&](int64_t, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data_.fill_val((b0 / spec_.train.global_batch), b0 % spec_.train.global_batch, n, x, y);
  };
  int64_t mbs = data_.num_val_batches() * (spec_.train.global_batch / spec_.train.micro_batch);
  const int64_t step = trainer_->current_step() - 1;
  double val = evaluator_->evaluate(val_batch, mbs);
  metrics_->write_validation(step, val);
  report_.add_validation(step, val);
  std::printf("step %5lld/%lld | val_loss %.4f\n", (long long)step, (long long)spec_.train.steps,
              val);
  std::fflush(stdout);
}

namespace {
// This process's page faults (minor and major) and CPU seconds (every thread's, user and
// system) so far: a step's share says whether it waited for the cores or faulted memory in.
// RUSAGE_THREAD: the calling thread's alone (the step's, without the background threads').
std::pair<double, double> faults_and_cpu(int who = RUSAGE_SELF) {
  struct rusage u {};
  ::getrusage(who, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return {double(u.ru_minflt + u.ru_majflt), s(u.ru_utime) + s(u.ru_stime)};
}
}  // namespace

std::optional<WorldEnd> RankTraining::one_step() {
  auto t0 = Clock::now();
  const auto [faults0, cpu0] = faults_and_cpu();
  const auto [thread_faults0, thread_cpu0] = faults_and_cpu(RUSAGE_THREAD);
  auto train_batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data_.fill_train(s, b0, n, x, y);
  };
  core::StepStats st = trainer_->step(train_batch);
  // Every rank has the same statistics, so every rank reaches the same verdict.
  NonfiniteGuard::Verdict verdict = guard_.observe(st);
  std::string first_bad;
  if (verdict == NonfiniteGuard::Verdict::kStop)
    first_bad = trainer_->first_nonfinite_gradient();  // collective, on the failure path only
  double secs = since(t0);
  // Every rank builds the line (the statistics are the same everywhere): one that becomes
  // the lead after a change writes it if this lead could not (write_agreed_line).
  // This rank's share of the step in kernels and in waiting for communication.
  const parallel::StepTimes& tt = trainer_->executor().last_step_times();
  const double mem = mib(trainer_->activation_stats().bytes_live_peak);  // this rank's
  const auto [faults1, cpu1] = faults_and_cpu();
  const auto [thread_faults1, thread_cpu1] = faults_and_cpu(RUSAGE_THREAD);
  core::io::StepMetrics m = step_line(st, secs,
                                      {{"step_ms", secs * 1e3},
                                       {"compute_ms", tt.compute * 1e3},
                                       {"comm_ms", tt.comm * 1e3},
                                       {"mem_peak_mib", mem},
                                       {"page_faults", faults1 - faults0},
                                       {"cpu_ms", (cpu1 - cpu0) * 1e3}});
  if (first_step_of_world_) m.extra.push_back({"resize_ms", resize_s_ * 1e3});
  // Every rank's own step (the metrics line is rank 0's): whether a world's first step costs
  // more than its later ones, and where (WEFT_LOG_SUBSYS=trainer).
  auto ms = [](double seconds) { return std::llround(seconds * 1e3); };
  const int64_t in_world = steps_in_world_++;
  WEFT_DEBUG("trainer", "rank ", env_.rank, ": step ", st.step, ", step ", in_world, " of world ",
             train_world_, " (epoch ", env_.rdzv_epoch, "): ", ms(secs), " ms (compute ",
             ms(tt.compute), ", comm ", ms(tt.comm), ", other ", ms(tt.other), "), ",
             (long long)(faults1 - faults0), " page faults, cpu ", ms(cpu1 - cpu0),
             " ms; its thread ", (long long)(thread_faults1 - thread_faults0), " page faults, cpu ",
             ms(thread_cpu1 - thread_cpu0), " ms; arena ",
             trainer_->activation_stats().bytes_reserved >> 20, " MiB");
  agreed_line_ = m;
  if (lead()) {
    metrics_->write_step(m);
    report_.add_step(m);
    if (verdict == NonfiniteGuard::Verdict::kSkipped)
      std::printf("%s\n", guard_.skipped_line(st).c_str());
    else if (verdict == NonfiniteGuard::Verdict::kApplied && spec_.train.log_every > 0 &&
             (st.step % spec_.train.log_every == 0 || st.step + 1 == spec_.train.steps ||
              first_step_of_world_))
      std::printf(
          "step %5lld/%lld | loss %.4f%s | lr %.2e | grad %.3f | %8.0f tok/s | mem %.1f MiB | "
          "%.0f ms%s\n",
          (long long)st.step, (long long)spec_.train.steps, st.loss,
          aux_cell(spec_, st.aux_loss).c_str(), st.lr, st.grad_norm, m.tokens_per_s, mem,
          secs * 1e3,
          first_step_of_world_
              ? str(" | world ", train_world_, " after a resize of ", resize_s_, " s").c_str()
              : "");
    std::fflush(stdout);
  }
  first_step_of_world_ = false;
  // checkpoint.every: every rank writes its shard, rank 0 commits. After the step's metrics
  // line, never before: a crash between the two would leave a checkpoint whose step has
  // no line, and a restart resuming from it keeps only the lines before it.
  if (verdict != NonfiniteGuard::Verdict::kStop) ckpt_->after_step();
  if (saved_by_every(spec_, trainer_->current_step())) saved_at_ = trainer_->current_step();
  if (verdict == NonfiniteGuard::Verdict::kStop) throw Error(guard_.stop_message(st, first_bad));
  const bool snapshot_ready = snaps_.ready();
  validate(trainer_->current_step() == spec_.train.steps);
  // Every rank stops, or moves to the next epoch, after the same step; and snapshots there
  // only if every rank can (lockstep snapshots).
  const Agreed a = agree_at_step_end(trainer_->world(), g_train_stop != 0,
                                     watch_.newer().has_value(), snapshot_ready,
                                     snaps_.proposed_interval());
  snaps_.after_agreement(a.snapshot, a.interval);
  if (a.stop) return WorldEnd::kStopped;
  if (a.change) return WorldEnd::kChange;
  return std::nullopt;
}

WorldEnd RankTraining::train_world() {
  // A lost member aborts this world's collectives at once (live only), its process groups'
  // too: aborting the world does not reach the communicators split from it, and a survivor
  // waiting in a group's collective for one that stopped at the abort would sit out the
  // timeout there.
  std::vector<comm::Communicator*> comms = {&world_->comm()};
  if (train_comm_) comms.push_back(train_comm_.get());
  for (comm::Communicator* c : trainer_->groups().communicators())
    if (std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  // A change that loses nobody is known a step ahead: its world connects meanwhile, and its
  // destinations are faulted in beside the step (prefault_ahead), less the state's sizes and
  // counting the rest of the trainer's persistent blocks (its gradients) as freed at its end.
  const std::vector<size_t> held = held_sizes(hold_state(*trainer_, ckpt_->space(), 0, false));
  const std::vector<size_t> grads = sizes_to_fault(trainer_->plan(), trainer_->rank(), held);
  LossWatcher watcher(watch_, comms, false, [this, &held, &grads](const EpochNotice& n) {
    ahead_.start(env_in_epoch(base_, n), watch_.path(), comm_timeout(), transfer_connections(),
                 trainers_of(n.world()));
    prefault_ahead(&n, held, grads);
  });
  while (trainer_->current_step() < spec_.train.steps)
    if (std::optional<WorldEnd> end = one_step()) return *end;
  return WorldEnd::kDone;
}

// Bounded: a world that failed without a membership change (a transport error, a world
// entry that failed on this rank alone) gets no notice; the worker then fails, and its
// agent's handling of that (the node leaves, or rejoins) makes the change the others wait for.
EpochNotice RankTraining::wait_for_notice() {
  const auto limit = std::chrono::milliseconds(env_int("WEFT_RESIZE_TIMEOUT_MS", 120'000));
  const auto t0 = Clock::now();
  NoticeWaiter waiter(watch_.path());  // wakes on the agent's notice, not at the next look
  for (;;) {
    if (std::optional<EpochNotice> n = watch_.newer()) return *n;
    if (g_train_stop) throw Error("stopped by a signal while waiting for the next membership epoch");
    if (Clock::now() - t0 > limit)
      throw Error(str("no new membership epoch from weft run within ",
                             double(limit.count()) / 1000,
                             " s after this world ended (WEFT_RESIZE_TIMEOUT_MS)"));
    waiter.wait(std::chrono::milliseconds(5));
  }
}

// The worlds a spare most likely enters: the lost node's place in a full world (its guessed
// rank, env_'s), then one node fewer (a loss that a spare does not fill at once). Their plans
// are made here, on this thread (nothing else runs while parked), and the state of the first
// faulted in (the sizes its admission allocates; another outcome trims them in enter_world).
std::optional<EpochNotice> RankTraining::park() {
  const auto t = Clock::now();
  const int per_node = std::max(1, local_count());
  std::vector<int> worlds{base_.nnodes_max * per_node};
  if (base_.nnodes_max - 1 >= std::max(1, base_.nnodes_min))
    worlds.push_back((base_.nnodes_max - 1) * per_node);
  // Plans only under the job's cost model: where the parked worker cannot read it yet (an
  // etcd job), nothing is planned ahead; its entry plans once the epoch's store says it.
  parked_now_ = true;
  bool model_known = true;
  try {
    (void)plans_.cost_model();
  } catch (const std::exception& e) {
    model_known = false;
    WEFT_DEBUG("planner", "rank ", env_.rank, ": parked without the job's cost model (", e.what(),
               "); planning at admission");
  }
  parked_now_ = false;
  if (!model_known) worlds.clear();
  // A world its degrees cannot train is left out here; its entry, if it comes, says why.
  std::vector<int> planned;
  for (int w : worlds) try {
      (void)plans_.plan(w);
      planned.push_back(w);
    } catch (const Error&) {
    }
  std::vector<size_t> sizes;
  if (!planned.empty() && planned[0] == worlds[0])
    sizes = sizes_to_fault(*plans_.plan(worlds[0]), env_.rank, held_);
  size_t bytes = 0;
  for (size_t b : sizes) bytes += b;
  if (!sizes.empty()) {
    prefault_.start(std::move(sizes), SIZE_MAX);
    prefault_.wait();
  }
  std::string list;
  for (int w : planned) list += (list.empty() ? "" : ", ") + std::to_string(w);
  std::printf(
      "weft train: rank %d parked (a spare's worker, pid %d): plans of worlds %s made and "
      "%.1f MiB of its state faulted in, %.2f s; waiting for its admission\n",
      env_.rank, int(::getpid()), list.c_str(), mib(bytes), since(t));
  std::fflush(stdout);
  std::optional<EpochNotice> n = wait_for_admission(watch_, g_train_stop);
  if (n) change_at_ = Clock::now();
  return n;
}

// Enters the world of env_; when a newer epoch replaces it before it trains (or one of its
// ranks fails meanwhile), moves on to the next notice, still holding what it held (held_ is
// released only once a world is entered).
void RankTraining::enter_next_world(std::string why) {
  for (;;) {
    try {
      enter_world(why);
      return;
    } catch (const CommError& e) {
      // A departing worker too: its node stays departed in the next epoch (its hand-over
      // was not confirmed), and it hands over there.
      if (!live_) throw;
      poke_agent();
      std::printf("weft train: rank %d: world of epoch %lld not entered (%s); waiting for the next\n",
                  env_.rank, (long long)env_.rdzv_epoch, e.what());
      std::fflush(stdout);
      snaps_.detach();
      ckpt_.reset();
      trainer_.reset();
      world_.reset();
      const EpochNotice n = wait_for_notice();
      adopt_notice(n);
      why = n.why;
    }
  }
}

planner::CostModel RankTraining::job_cost_model() {
  const std::string dtype = job_.train.dtype;
  JobCostModel m;
  if (env_.launcher == "single") {
    m = choose_job_cost_model(dtype);  // one process, no store: nobody to agree with
  } else {
    // Parked, the address is the rendezvous endpoint's: a store under c10d (the job's model
    // is there), etcd's otherwise, which does not answer as one: a short try, no wait.
    const comm::Millis timeout = parked_now_ ? comm::Millis(2'000) : comm_timeout();
    comm::TCPStore store(comm::TCPStoreOptions{env_.store_host, env_.store_port, timeout,
                                               comm::auth::token_from_env()});
    // Only the lead of the job's first world chooses: in a later epoch of a live job the
    // survivors hold it (republish_job_cost_model), and a new lead waits for theirs. A job
    // that restarts every worker (not live) chooses again only where the store lost it.
    const bool may_choose = lead() && !parked_now_ && (!live_ || env_.rdzv_epoch <= 1);
    m = share_job_cost_model(store, job_cost_model_key(), may_choose, std::nullopt, dtype,
                             parked_now_ ? comm::Millis(100) : timeout);
    job_model_store_ = str(env_.store_host, ":", env_.store_port);
  }
  job_model_text_ = m.text;
  job_model_used_ = m.used;
  if (lead() && !parked_now_) {
    std::printf("weft train: cost model: %s; every rank of the job plans under it\n",
                m.used.c_str());
    std::fflush(stdout);
  }
  return m.model;
}

void RankTraining::republish_job_cost_model() {
  const std::string here = str(env_.store_host, ":", env_.store_port);
  if (!job_model_text_ || env_.launcher == "single" || here == job_model_store_) return;
  comm::TCPStore store(comm::TCPStoreOptions{env_.store_host, env_.store_port, comm_timeout(),
                                             comm::auth::token_from_env()});
  (void)share_job_cost_model(store, job_cost_model_key(), false, job_model_text_, job_.train.dtype,
                             comm_timeout());
  job_model_store_ = here;
}

// A step whose statistics exchange this rank completed before a collective of the step
// failed: if some rank finished the step, the next world resumes after it, and its line
// must come from a rank that knows the statistics (the lead may have been torn after the
// exchange, or lost).
void RankTraining::keep_agreed_line() {
  const std::optional<core::StepStats>& st = trainer_->exchanged_stats();
  if (!st || (agreed_line_ && agreed_line_->step >= st->step)) return;
  // The step's time is unknown (this rank did not finish it): no rate, no step_ms.
  agreed_line_ = step_line(*st, 0, {{"torn", 1}});
}

// A step's metrics line: the statistics, then aux_loss (MoE), `extra`, and skipped when the
// update was dropped. `secs` 0: the step's time is unknown (tokens_per_s 0).
core::io::StepMetrics RankTraining::step_line(
    const core::StepStats& st, double secs,
    std::vector<std::pair<std::string, double>> extra) const {
  core::io::StepMetrics m = step_metrics(st, secs > 0 ? secs : 1, train_world_, env_.rdzv_epoch,
                                         data_.sampler().epoch(st.step));
  if (secs <= 0) m.tokens_per_s = 0;
  m.extra = std::move(extra);
  if (spec_.model.arch == "moe-gpt") m.extra.insert(m.extra.begin(), {"aux_loss", st.aux_loss});
  if (!st.applied) m.extra.push_back({"skipped", 1});
  return m;
}

// A new lead whose world resumes right after a step without a line writes that step's line
// from the statistics it kept (a lead that wrote it leaves nothing to do; a resume at an
// earlier step dropped it and redoes the step).
void RankTraining::write_agreed_line() {
  if (!agreed_line_ ||
      !append_agreed_line(*metrics_, *agreed_line_, trainer_->current_step()))
    return;
  WEFT_DEBUG("resize", "rank ", env_.rank, ": wrote step ", agreed_line_->step,
             "'s metrics line, which the last world's lead did not");
}

int RankTraining::run() {
  catch_stop_signals();
  if (live_) mark_following(watch_.path(), env_.local_rank);
  auto t_start = Clock::now();
  if (parked_worker()) {
    const std::optional<EpochNotice> n = park();
    // Stopped unadmitted: the job ended, or (not live: elastic.on_change restart) its agent
    // starts a worker in the epoch instead.
    if (!n) return 0;
    adopt_notice(*n);
    enter_next_world(n->why);  // a newcomer like any other from here on
  } else {
    // Its agent's notice of the epoch it was started in (node_agent.cc) gives the epoch's
    // first world: its members, then the nodes still handing over. The environment counts
    // the members only, and every rank of one world must agree on its size.
    if (live_)
      if (std::optional<EpochNotice> n = read_epoch_notice(watch_.path());
          n && n->epoch == env_.rdzv_epoch)
        adopt_notice(*n);
    enter_next_world("");
  }
  if (leaving_) return leave_job();
  for (;;) {
    WorldEnd end;
    std::string why;
    bool torn = false;
    try {
      end = train_world();
    } catch (const CommError& e) {
      if (!live_) throw;  // (a departing worker never trains: it is in leave_job)
      change_at_ = Clock::now();
      poke_agent();  // a peer is likely gone: the agent looks at the membership now
      end = WorldEnd::kFailed;
      torn = trainer_->torn();
      why = e.what();
      keep_agreed_line();
    }
    if (end == WorldEnd::kDone || end == WorldEnd::kStopped) {
      total_s_ = since(t_start);
      return finish(end == WorldEnd::kStopped);
    }
    if (end == WorldEnd::kChange) change_at_ = Clock::now();
    // This world is over: keep the state, drop everything else, go to the next epoch.
    Laps end_laps;  // the resize line's "membership", finer (debug)
    snaps_.detach();  // the copy in flight is of the last complete state
    end_laps.lap("snapshot detach");
    held_ = hold_state(*trainer_, ckpt_->space(), env_.rdzv_epoch, torn);
    end_laps.lap("state held");
    metrics_.reset();
    ckpt_.reset();
    end_laps.lap("metrics and checkpoints dropped");
    // A step stopped right before its update, with a local rest: its trainer (the reduced
    // gradients, the executor at the update) waits for the next world's entry.
    if (held_.unfinished >= 0) behind_ = std::move(trainer_);
    trainer_.reset();
    end_laps.lap("trainer dropped");
    world_.reset();
    end_laps.lap("world dropped");
    {  // while the membership is agreed; a notice's reserve, started beside the step, goes on
      const std::optional<EpochNotice> n = watch_.newer();
      // A rank whose step stopped before its update keeps that trainer, its gradients
      // with it, until the entry's roll forward: counted as a notice's reserve counts a
      // training rank's (freed before the move, their sizes kept for the next layout).
      const std::vector<size_t> held = held_sizes(held_);
      std::vector<size_t> freed;
      if (behind_) freed = sizes_to_fault(behind_->plan(), behind_->rank(), held);
      prefault_ahead(n ? &*n : nullptr, held, freed);
    }
    end_laps.lap("prefault started");
    const EpochNotice n = wait_for_notice();
    end_laps.lap("notice wait");
    WEFT_DEBUG("resize", "epoch ", env_.rdzv_epoch, " end: ", since(change_at_) * 1e3,
               " ms after the change was known here: ", end_laps.text());
    adopt_notice(n);
    if (end == WorldEnd::kChange || why.empty()) why = n.why;
    else why = n.why + " (a collective failed: " + why + ")";
    enter_next_world(why);
    if (leaving_) return leave_job();
  }
}

// A departing node's worker after the hand-over: it says so to its agent and ends once the
// agent has confirmed it (released_in); a later epoch that formed first still lists its node
// as departed (the world it handed over in may not have completed its move everywhere), so
// it hands over again there (holding what it still holds: nothing, after a complete move).
// Bounded like wait_for_notice.
int RankTraining::leave_job() {
  const auto limit = std::chrono::milliseconds(env_int("WEFT_RESIZE_TIMEOUT_MS", 120'000));
  for (;;) {
    train_comm_.reset();
    world_.reset();
    if (watch_.path().empty()) break;  // not under an agent that sends notices
    mark_handed_over(watch_.path(), env_.local_rank, env_.rdzv_epoch);
    const auto t0 = Clock::now();
    NoticeWaiter waiter(watch_.path());
    std::optional<EpochNotice> next;
    while (!released_in(watch_.path(), env_.rdzv_epoch)) {
      if ((next = watch_.newer())) break;
      if (g_train_stop) break;  // handed over already: a stop now ends it unconfirmed
      if (Clock::now() - t0 > limit)
        throw Error(str("weft run did not confirm the hand-over of epoch ", env_.rdzv_epoch,
                        " within ", double(limit.count()) / 1000, " s (WEFT_RESIZE_TIMEOUT_MS)"));
      waiter.wait(std::chrono::milliseconds(5));
    }
    if (!next) break;
    adopt_notice(*next);
    enter_next_world(next->why);
    if (!leaving_) throw Error("a departing worker was posted an epoch to train in");
  }
  // What the world took instead when it did not need this rank's live state (a process of
  // the world was lost with a part that only it held): the world's arrival names it. The
  // snapshots read may be this node's own (its agent serves them after its workers leave).
  const std::string& src = arrival_.source;
  std::printf("weft train: rank %d of epoch %lld left the job after handing its state over (%s)\n",
              env_.rank, (long long)env_.rdzv_epoch,
              src == "survivors"    ? "through the router"
              : src == "snapshots"  ? "its live state was not needed: the world resumes from "
                                      "in-memory snapshots (this node's may be among them)"
              : src == "checkpoint" ? "its live state was not needed: the world resumes from a "
                                      "checkpoint"
                                    : "its live state was not needed: the world starts over "
                                      "from step 0");
  std::fflush(stdout);
  return 0;
}

int RankTraining::finish(bool stop) {
  std::string final_save;
  if (stop && !spec_.checkpoint.dir.empty() && saved_at_ != trainer_->current_step())
    final_save = ckpt_->save();  // collective: every rank agreed to stop at this step
  core::NamedTensors w;
  if (args_.has("--save-weights")) w = trainer_->gather_weights();  // collective
  if (!lead()) return stop ? 130 : 0;
  if (stop)
    std::printf("interrupted: stopped cleanly after step %lld\n",
                (long long)trainer_->current_step() - 1);
  if (!final_save.empty()) std::printf("interrupted: saved checkpoint %s\n", final_save.c_str());
  if (args_.has("--save-weights")) core::io::save_safetensors(args_.get("--save-weights"), w);
  metrics_.reset();
  const fs::path out = folder_->out;
  core::io::write_loss_curve_svg((out / "loss_curve.svg").string(),
                                 core::io::read_metrics(folder_->metrics_path));
  std::string summary = report_.summary(total_s_, trainer_->activation_stats(), spec_.memory.allocator);
  summary += "cost model: " + job_model_used_ + "\n";  // what every world was planned under
  std::ofstream(out / "summary.txt") << summary;
  std::fputs(summary.c_str(), stdout);
  std::printf("run folder: %s (metrics.jsonl, loss_curve.svg, summary.txt)\n",
              out.string().c_str());
  return stop ? 130 : 0;
}

}  // namespace

int train_ranks(const Args& args, const core::JobSpec& spec, const parallel::LaunchEnv& env) {
  // `weft run` prefixes every line of its workers with [rank r]; mpirun and srun do not.
  if (env.launcher != "weft run") log_set_rank(env.rank);
  // Bad degrees fail here, before any rank connects; so does a job that cannot fit, on
  // every rank alike, before anything is allocated.
  planner::check_fits_memory(planner::fit_layout(spec, env.world), env.world, ranks_on_node(env));
  core::cpu::set_num_threads(int(spec.train.threads));
  RankTraining t(args, spec, env);
  return t.run();
}

}  // namespace weft::launch
