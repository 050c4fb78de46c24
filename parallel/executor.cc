// RankExecutor: the instruction interpreter.
#include "parallel/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>

#include "base/check.h"
#include "base/error.h"
#include "core/exec/nonfinite.h"
#include "core/graph/moe_balance.h"
#include "core/graph/op_parts.h"
#include "parallel/compute.h"
#include "parallel/regions.h"
#include "planner/validate.h"

namespace weft::parallel {

using planner::Instr;
using planner::InstrKind;

RankExecutor::RankExecutor(const planner::Plan& plan, const core::Graph& g, int rank,
                           comm::Communicator& world, const ProcessGroups& groups, bool defer_state,
                           memory::Allocator* persistent)
    : plan_(plan), g_(g), prog_(plan.program(rank)), world_(world), groups_(groups) {
  planner::require_valid(plan_, g_);
  table_ = std::make_unique<TensorTable>(prog_, g_, nullptr, persistent, defer_state);
  std::map<int, std::set<int64_t>> sent, received;
  for (const Instr& in : prog_.program) {
    if (in.kind == InstrKind::kSend) sent[in.peer].insert(in.tag);
    if (in.kind == InstrKind::kRecv) received[in.peer].insert(in.tag);
  }
  auto index = [](const std::map<int, std::set<int64_t>>& by_peer,
                  std::map<std::pair<int, int64_t>, int>& out) {
    for (const auto& [peer, tags] : by_peer) {
      int i = 0;
      for (int64_t t : tags) out[{peer, t}] = i++ % (comm::kMaxTag + 1);
    }
  };
  index(sent, send_tag_);
  index(received, recv_tag_);
  for (size_t i = 0; i < prog_.program.size(); ++i)
    if (prog_.program[i].kind == InstrKind::kRecv) recv_positions_.push_back(i);
  norm_value_ = g_.find_value("grad_norm");
  // adamw updates its inputs (parameter, moments) in place, so its graph op lists no
  // outputs; anything else that changes state writes a state root (ZeRO's gather of the
  // updated shards).
  for (const Instr& in : prog_.program) {
    bool writes = in.kind == InstrKind::kCompute && g_.op(in.op).type == "adamw";
    for (const planner::Operand& o : in.out) {
      int root = o.tensor;
      while (table_->desc(root).alias_of >= 0) root = table_->desc(root).alias_of;
      writes = writes || table_->state_root(root);
    }
    writes_state_.push_back(writes);
  }
  local_from_.assign(prog_.program.size() + 1, 1);
  for (size_t i = prog_.program.size(); i-- > 0;) {
    const InstrKind k = prog_.program[i].kind;
    const bool local =
        k == InstrKind::kCompute || k == InstrKind::kLocal || k == InstrKind::kFree;
    local_from_[i] = local && local_from_[i + 1];
  }
  if (const char* dir = std::getenv("WEFT_INSTR_TIMES"); dir && *dir) {
    instr_times_dir_ = dir;
    instr_times_.run_s.assign(prog_.program.size(), 0);
    instr_times_.settle_s.assign(prog_.program.size(), 0);
  }
}

void RankExecutor::set_loss_values(const std::vector<int>& values) {
  loss_tensors_.clear();
  for (size_t i = 0; i < table_->size(); ++i) {
    const planner::TensorDesc& d = table_->desc(int(i));
    if (d.alias_of < 0 && std::find(values.begin(), values.end(), d.value) != values.end())
      loss_tensors_.push_back(int(i));
  }
}

bool RankExecutor::local_loss_nonfinite(bool* complete) {
  *complete = true;
  for (int id : loss_tensors_) {
    if (!table_->live(id)) {
      *complete = false;  // not written yet this step (a later micro-batch's forward)
      continue;
    }
    if (!core::all_finite(table_->read(id))) return true;
  }
  return false;
}

void RankExecutor::poison_first_input(const Instr& in) {
  for (const planner::Operand& o : in.in) {
    if (!table_->viewable(o.tensor) || !table_->live(o.tensor)) continue;
    core::Tensor& x = table_->read(o.tensor);
    if (x.numel() == 0) continue;
    if (x.dtype() == core::DType::kF32)
      *static_cast<float*>(x.raw_data()) = std::numeric_limits<float>::quiet_NaN();
    else if (x.dtype() == core::DType::kF64)
      *static_cast<double*>(x.raw_data()) = std::numeric_limits<double>::quiet_NaN();
    else
      continue;
    return;
  }
}

RankExecutor::~RankExecutor() {
  // Sends still in flight own their buffers (Work keeps the storage); nothing to release.
  if (instr_times_dir_.empty() || instr_times_.steps == 0) return;
  // A debugging aid: a folder that cannot be written loses the file, never the run.
  std::ofstream f(instr_times_dir_ + "/instr-" + std::to_string(prog_.rank) + ".tsv");
  const double n = instr_times_.steps;
  f << "# steps " << instr_times_.steps << " tail_s " << instr_times_.tail_s / n << " update_s "
    << instr_times_.update_s / n << "\n";
  for (size_t i = 0; i < prog_.program.size(); ++i)
    f << i << '\t' << instr_times_.run_s[i] / n << '\t' << instr_times_.settle_s[i] / n << '\n';
}

void RankExecutor::init_parameters(uint64_t seed) {
  for (size_t i = 0; i < table_->size(); ++i) {
    const planner::TensorDesc& d = table_->desc(int(i));
    if (!d.persistent || d.alias_of >= 0 || d.value < 0) continue;
    const core::Value& v = g_.value(d.value);
    if (v.role != core::Role::kParameter) continue;
    init_parameter_piece(table_->read(int(i)), d.piece.box, v, seed);
  }
}

int RankExecutor::small_tag(bool send, int peer, int64_t tag) const {
  const auto& m = send ? send_tag_ : recv_tag_;
  auto it = m.find({peer, tag});
  WEFT_CHECK(it != m.end(), "no tag for peer ", peer, " tag ", tag);
  return it->second;
}

void RankExecutor::send(const Instr& in) {
  int id = in.in.at(0).tensor;
  // A tensor that outlives this instruction's neighbourhood (persistent, kept) may be written
  // again while the send is in flight: send a copy of it.
  const planner::TensorDesc& d = table_->desc(id);
  core::Tensor buf =
      d.persistent || d.keep ? table_->read(id).clone() : table_->read(id).contiguous();
  comm::SendOptions o;
  o.tag = small_tag(true, in.peer, in.tag);
  sends_[id].push_back(world_.send(buf, in.peer, o));
}

namespace {
constexpr size_t kRecvAhead = 2;
}

void RankExecutor::post_receives_ahead(size_t from) {
  while (next_recv_ < recv_positions_.size() && recv_positions_[next_recv_] < from)
    ++next_recv_;  // already run (or posted)
  while (next_recv_ < recv_positions_.size() && posted_.size() < kRecvAhead) {
    const size_t at = recv_positions_[next_recv_++];
    const Instr& in = prog_.program[at];
    const planner::TensorDesc& d = table_->desc(in.out.at(0).tensor);
    comm::RecvOptions o;
    o.tag = small_tag(false, in.peer, in.tag);
    PostedRecv p{table_->staging(planner::box_shape(d.piece.box), d.dtype), {}};
    p.work = world_.recv(p.buffer, in.peer, o);
    posted_.emplace(at, std::move(p));
  }
}

void RankExecutor::recv(const Instr& in) {
  const size_t at = size_t(&in - prog_.program.data());
  post_receives_ahead(at);
  auto it = posted_.find(at);
  WEFT_CHECK(it != posted_.end(), "receive at program position ", at, " was not posted");
  PostedRecv p = std::move(it->second);
  posted_.erase(it);
  post_receives_ahead(at + 1);  // keep the next ones in flight while this one arrives
  p.work.wait();
  table_->write(in.out.at(0).tensor, false).copy_from(p.buffer);
}

void RankExecutor::wait_all_sends() {
  for (auto& [id, works] : sends_)
    for (const comm::Work& w : works) w.wait();
  sends_.clear();
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The step's expert counts summed over every rank (each rank adds the routings it ran).
void reduce_balance(core::MoeBalance& b, comm::Communicator& world) {
  std::vector<double> mine = b.pack();
  core::Tensor t = core::Tensor::from_vector<double>({int64_t(mine.size())}, mine);
  world.all_reduce(t).wait();
  b.absorb(t.to_vector<double>());
}

}  // namespace

void RankExecutor::run_step(const core::StepScalars& scalars, const LoadFn& load,
                            const std::function<void()>& before_update) {
  state_written_ = false;
  paused_at_ = kNotPaused;
  bool updating = false;  // before_update ran
  // `at`: the program position about to run (its size at the end). Should before_update
  // throw, the step stops there with nothing written, and finish_step may resume it.
  auto begin_update = [&](size_t at) {
    if (updating) return;
    updating = true;
    if (!before_update) return;
    paused_at_ = at;
    paused_scalars_ = scalars;
    read_last_norm();  // reduced by now (every adamw waits for it): finish_step's check
    before_update();
    paused_at_ = kNotPaused;
  };
  table_->zero_gradients();
  // The last step's losses must not decide this step's fold (below): a dropped step's NaN
  // loss would otherwise poison the next step's first bucket too.
  table_->release_kept();
  moe_ = MoeState();
  core::StepScalars s = scalars;
  core::MoeBalance* balance = s.moe_balance;
  if (balance) balance->begin_step();
  // aux_loss_global: the shares are reduced once every forward of the step ran here, before
  // the first backward (the plan orders every forward first; resolve_parallel checks it).
  bool shares_pending = balance && balance->mode() == core::MoeBalance::Mode::kGlobalAux;
  times_ = StepTimes();
  // The fold is decided from this step's local loss pieces. Every one exists before the
  // norm partial sums (the step phase follows every forward), but not always before the first
  // gradient bucket: ZeRO-2/3 reduce-scatter each micro-batch's gradients during its
  // backward, before the next micro-batch's forward. A verdict is final once a piece is not
  // finite or every piece exists; until then each check looks again. (Sharded norm partials
  // are reduced over the data-parallel replicas, so ZeRO's late verdict still reaches every
  // rank; without ZeRO the buckets go out after the last forward.)
  bool loss_known = false, loss_bad = false, poisoned = false;
  auto loss_nonfinite = [&] {
    if (!loss_known) {
      bool complete = false;
      loss_bad = local_loss_nonfinite(&complete);
      loss_known = loss_bad || complete;
    }
    return loss_bad;
  };
  next_recv_ = 0;
  posted_.clear();
  post_receives_ahead(0);
  using Clock = std::chrono::steady_clock;
  // Per-instruction timing ($WEFT_INSTR_TIMES): every step after the first.
  const bool time_instrs = !instr_times_dir_.empty() && instr_times_.seen++ > 0;
  if (time_instrs) ++instr_times_.steps;
  bool exchange_timed = false;
  for (const Instr& in : prog_.program) {
    // A lost member aborts the world (launch/live_resize.h's LossWatcher). The step cannot
    // commit then, so it stops here instead of computing on until its next collective fails:
    // on a 100M model that was up to a second of the resize's downtime. Only before the step
    // writes state: from there on it ends as before, at a collective, with the state torn
    // or whole as state_written() says.
    if (!state_written_ && world_.aborted())
      throw CommError(str("rank ", world_.rank(), " stopped its step before instruction ",
                          &in - prog_.program.data(), " of ", prog_.program.size(),
                          ": this world's communicator was aborted (a member was lost)"));
    auto t0 = Clock::now();
    if (shares_pending && in.stage != planner::Stage::kForward) {
      reduce_balance(*balance, world_);
      balance->freeze_shares();
      shares_pending = false;
    }
    if (!pending_.empty()) settle(roots(in));
    const double settled = seconds_since(t0);
    double update_dt = 0;  // of this instruction's time, before_update's
    times_.comm += settled;
    t0 = Clock::now();
    double* bucket = in.kind == InstrKind::kCompute ? &times_.compute
                     : in.kind == InstrKind::kRecv || (in.kind == InstrKind::kCollective && in.part != "grad.sync")
                         ? &times_.comm
                         : &times_.other;
    // After settle(): a bucket this instruction waits for can still fail with the state intact.
    if (writes_state_[size_t(&in - prog_.program.data())]) {
      begin_update(size_t(&in - prog_.program.data()));
      state_written_ = true;
      // before_update (the trainer's statistics exchange) is not this instruction's time.
      if (time_instrs && !exchange_timed) {
        update_dt = seconds_since(t0);
        instr_times_.update_s += update_dt;
        exchange_timed = true;
      }
    }
    switch (in.kind) {
      case InstrKind::kLoad: {
        const planner::Operand& o = in.out.at(0);
        const planner::TensorDesc& d = table_->desc(o.tensor);
        load(d.value, d.piece.box, table_->write(o.tensor, false));
        break;
      }
      case InstrKind::kCompute: {
        compute(in, s);
        if (in.part == "norm.sumsq" && loss_nonfinite())
          for (const planner::Operand& o : in.out)
            table_->read(o.tensor).fill_(std::numeric_limits<double>::quiet_NaN());
        break;
      }
      case InstrKind::kLocal:
        local_copy(in);
        break;
      case InstrKind::kSend:
        send(in);
        break;
      case InstrKind::kRecv:
        recv(in);
        break;
      case InstrKind::kCollective: {
        // A data-parallel replica whose loss is not finite (its gradients may still be) makes
        // the synced gradients, hence every replica's norm, non-finite (gradients are
        // replicated there and the norm is reduced within one replica).
        if (in.part == "grad.sync" && !poisoned && loss_nonfinite()) {
          poison_first_input(in);
          poisoned = true;
        }
        PendingCollective p = start_collective(in, *table_, groups_.group(in.group), moe_);
        // Gradient buckets overlap with the backward compute that follows; everything else
        // completes here (receives and collectives block).
        if (in.part == "grad.sync")
          pending_.push_back({&in, std::move(p), roots(in)});
        else
          complete(in, p);
        break;
      }
      case InstrKind::kFree:
        // A send in flight keeps its buffer alive through its Work, so the slot can go now.
        // Waiting here instead would deadlock 1F1B: a send completes only when the peer
        // posts the receive, which it does after its own send to us.
        for (const planner::Operand& o : in.in) table_->release(o.tensor);
        break;
    }
    const double ran = seconds_since(t0);
    *bucket += ran;
    if (time_instrs) {
      const size_t at = size_t(&in - prog_.program.data());
      instr_times_.run_s[at] += ran - update_dt;
      instr_times_.settle_s[at] += settled;
    }
  }
  auto t_end = Clock::now();
  while (!pending_.empty()) {
    complete(*pending_.front().instr, pending_.front().op);
    pending_.pop_front();
  }
  wait_all_sends();
  times_.comm += seconds_since(t_end);
  if (time_instrs) instr_times_.tail_s += seconds_since(t_end);
  if (shares_pending) {  // a program without backward work still agrees with its peers
    reduce_balance(*balance, world_);
    balance->freeze_shares();
  }
  read_last_norm();
  auto t_update = Clock::now();
  begin_update(prog_.program.size());  // a rank with no state to update still takes part
                                       // (it is collective)
  if (time_instrs && !exchange_timed) instr_times_.update_s += seconds_since(t_update);
  if (balance && balance->mode() == core::MoeBalance::Mode::kLossFree) {
    // The bias moves after the step, from the load of the whole global batch; not on a
    // dropped step (the norm is the same on every rank, so all agree).
    reduce_balance(*balance, world_);
    if (std::isfinite(last_norm_)) {
      state_written_ = true;
      balance->update_bias();
    }
  }
}

void RankExecutor::compute(const Instr& in, core::StepScalars& s) {
  s.micro_batch = in.mb;
  s.record_routing = !in.recompute;
  std::vector<int64_t> rows;
  if (in.part == "moe.experts") {
    const core::Op& op = g_.op(in.op);
    auto it = moe_.all.find({op.type == "moe.bwd" ? op.mirror : in.op, in.mb});
    WEFT_CHECK(it != moe_.all.end(), "moe.experts before its dispatch");
    rows = it->second.expert_rows();
  }
  run_compute_instr(in, *table_, s, nullptr, rows);
  if (in.part == "moe.route" && g_.op(in.op).type == "moe") {
    for (const planner::Operand& o : in.out)
      if (o.slot == 3) {
        int64_t experts = g_.value(g_.op(in.op).inputs[1]).shape[0];
        moe_.own[{in.op, in.mb}] = core::moe_expert_counts(table_->read(o.tensor), experts);
      }
  }
}

void RankExecutor::local_copy(const Instr& in) {
  const planner::Operand &src = in.in.at(0), &dst = in.out.at(0);
  const planner::Box& ob = table_->desc(dst.tensor).piece.box;
  TensorTable::Located from = table_->locate(src.tensor, false, false);
  TensorTable::Located to = table_->locate(dst.tensor, true, dst.accumulate);
  copy_region(*to.tensor, *to.box, *from.tensor, *from.box, ob, dst.accumulate);
}

void RankExecutor::read_last_norm() {
  last_norm_ = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < table_->size(); ++i) {
    const planner::TensorDesc& d = table_->desc(int(i));
    if (d.value == norm_value_ && d.alias_of < 0 && table_->live(int(i)))
      last_norm_ = table_->read(int(i)).item();
  }
}

bool RankExecutor::can_finish_step() const {
  if (paused_at_ == kNotPaused || !local_from_[paused_at_]) return false;
  if (!pending_.empty() || !posted_.empty()) return false;
  const core::MoeBalance* b = paused_scalars_.moe_balance;
  return !(b && b->mode() == core::MoeBalance::Mode::kLossFree);
}

void RankExecutor::finish_step() {
  WEFT_CHECK(can_finish_step(), "finish_step: the last step did not stop before an update whose "
                                "rest is local (can_finish_step)");
  // Every send of the step was received: a peer finished its exchange only once every rank
  // reached its update, and every receive precedes that when the rest is local. Their Works
  // own their buffers and need no communicator.
  sends_.clear();
  core::StepScalars s = paused_scalars_;
  const size_t from = paused_at_;
  paused_at_ = kNotPaused;
  for (size_t at = from; at < prog_.program.size(); ++at) {
    const Instr& in = prog_.program[at];
    if (writes_state_[at]) state_written_ = true;
    switch (in.kind) {
      case InstrKind::kCompute:
        compute(in, s);
        break;
      case InstrKind::kLocal:
        local_copy(in);
        break;
      case InstrKind::kFree:
        for (const planner::Operand& o : in.in) table_->release(o.tensor);
        break;
      default:
        throw InternalError(str("finish_step: instruction ", at, " of rank ", prog_.rank,
                                " needs a peer (can_finish_step let it through)"));
    }
  }
  read_last_norm();
}

std::vector<int> RankExecutor::roots(const Instr& in) const {
  std::vector<int> out;
  auto add = [&](int id) {
    while (table_->desc(id).alias_of >= 0) id = table_->desc(id).alias_of;
    out.push_back(id);
  };
  for (const planner::Operand& o : in.in) add(o.tensor);
  for (const planner::Operand& o : in.out) add(o.tensor);
  return out;
}

void RankExecutor::settle(const std::vector<int>& touched) {
  // Complete in issue order up to the last in-flight bucket that shares storage with
  // `touched`: the outputs must be in place before anything reads or writes them.
  size_t last = 0;
  for (size_t i = 0; i < pending_.size(); ++i)
    for (int r : pending_[i].roots)
      if (std::find(touched.begin(), touched.end(), r) != touched.end()) last = i + 1;
  for (size_t i = 0; i < last; ++i) {
    complete(*pending_.front().instr, pending_.front().op);
    pending_.pop_front();
  }
}

void RankExecutor::complete(const Instr& in, PendingCollective& p) {
  try {
    p.complete();
  } catch (const PeerLostError& e) {
    // The group's communicator names its own rank; say which process was lost.
    const std::vector<int>& ranks = plan_.groups.at(size_t(in.group)).ranks;
    int lost = e.peer() >= 0 && size_t(e.peer()) < ranks.size() ? ranks[size_t(e.peer())] : -1;
    const std::string group = "process group " + std::to_string(in.group);
    throw PeerLostError(lost, (lost >= 0 ? "lost rank " + std::to_string(lost) + " (" + group + ")"
                                         : "lost a peer of " + group +
                                               " (the communicator did not say which)") +
                                  ": " + e.what());
  }
}

}  // namespace weft::parallel
