// The multi-rank symbolic executor.
#include "planner/engine.h"

#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

#include "base/check.h"

namespace weft::planner {

std::vector<core::Shape> operand_shapes(const std::vector<TensorDesc>& tensors,
                                        const OperandList& ops) {
  std::vector<core::Shape> s;
  for (const Operand& o : ops) s.push_back(box_shape(tensors.at(size_t(o.tensor)).piece.box));
  return s;
}

PlanWork plan_work(const Plan& plan, const core::Graph& g) {
  PlanWork work(plan.roles.size());
  // The operand shapes of one instruction at a time, in buffers reused for the next (a plan
  // has millions of operands; op_work keeps none of them).
  std::vector<core::Shape> ins, outs;
  // Every tensor's dense shape, read in one pass in table order: operands refer to tensors
  // all over the table, and reading each operand's description and box where it lies cost
  // two cache misses per operand. dims[first[t], first[t + 1]) is tensor t's shape.
  std::vector<int64_t> dims;
  std::vector<size_t> first;
  std::vector<uint8_t> elem_of;  // tensor -> its element's bytes
  auto shapes = [&](const OperandList& ops, std::vector<core::Shape>& out) {
    out.resize(ops.size());
    for (size_t k = 0; k < ops.size(); ++k) {
      const size_t t = size_t(ops[k].tensor);
      WEFT_CHECK(t + 1 < first.size(), "operand tensor ", ops[k].tensor, " outside the table");
      out[k].assign(dims.begin() + ptrdiff_t(first[t]), dims.begin() + ptrdiff_t(first[t + 1]));
    }
  };
  for (size_t k = 0; k < plan.roles.size(); ++k) {
    const Role& role = plan.roles[k];
    dims.clear();
    first.assign(1, 0);
    elem_of.clear();
    for (const TensorDesc& t : role.tensors) {
      for (const DimSlice& d : t.piece.box) dims.push_back(d.numel());
      first.push_back(dims.size());
      elem_of.push_back(uint8_t(core::dtype_size(t.dtype)));
    }
    work[k].assign(role.program.size(), OpWork{});
    for (size_t i = 0; i < role.program.size(); ++i) {
      const Instr& in = role.program[i];
      if (in.kind != InstrKind::kCompute) continue;
      shapes(in.in, ins);  // (checks the operands' tensor ids)
      shapes(in.out, outs);
      size_t elem = 4;
      if (!in.out.empty()) elem = elem_of[size_t(in.out[0].tensor)];
      else if (!in.in.empty()) elem = elem_of[size_t(in.in[0].tensor)];
      work[k][i] = op_work(g.op(in.op), in.part, ins, outs, elem);
    }
  }
  return work;
}

PlanDurations durations_alone(const Plan& plan, const PlanWork& work, const CostModel& cost) {
  PlanDurations out(plan.roles.size());
  for (size_t k = 0; k < plan.roles.size(); ++k) {
    const Role& role = plan.roles[k];
    std::vector<double>& d = out[k];
    d.assign(role.program.size(), 0);
    for (size_t i = 0; i < role.program.size(); ++i) {
      const Instr& in = role.program[i];
      if (in.kind == InstrKind::kCompute)
        d[i] = cost.compute_alone(work[k][i]);
      else if (in.kind == InstrKind::kLocal)
        d[i] = cost.local_copy_alone(role.tensors[size_t(in.out[0].tensor)].bytes);
    }
  }
  return out;
}

double collective_seconds(const Plan& plan, const core::Graph& g, const CostModel& cost,
                          const Instr& in, int n, bool cross) {
  double d = cost.collective(in.coll, n, in.bytes, cross, plan.world());
  // The executor learns a MoE layer's row counts with an all_gather of one int64 per
  // expert and member before the forward dispatch of each micro-batch
  // (parallel/collectives.cc): one more small collective on the same group.
  if (in.coll == CollKind::kAllToAllV && in.part == "moe.dispatch" && in.stage == Stage::kForward &&
      !in.recompute) {
    const core::Op& op = g.op(in.op);
    const int64_t experts = op.inputs.size() > 1 ? g.value(op.inputs[1]).shape.at(0) : 1;
    d += cost.collective(CollKind::kAllGather, n, moe_count_bytes(experts, n), cross, plan.world());
  }
  return d;
}

namespace {

struct RoleInfo {
  std::vector<int> root;        // tensor -> storage root
  std::vector<int64_t> bytes;   // tensor -> its bytes (read at every allocation and free)
  std::vector<double> compute;  // instruction -> duration of compute/local work
  int64_t persistent = 0;
};

struct Message {
  int64_t bytes;
  double time;
  int send = 0;  // sends so far, when it was sent (EngineSchedule::recv_send)
  double burst = 0;  // the sender's compute since its last synchronisation, at the send
  double drift_var = 0, drift_paid = 0;  // the sender's replica drift, at the send (Rank)
};

// What the members of a collective must agree on; compared as numbers, spelled only for
// an error (signature_str).
struct Signature {
  CollKind coll = CollKind::kAllReduce;
  bool max = false;
  int64_t bytes = 0;
  bool operator==(const Signature& o) const = default;
};

std::string signature_str(const Signature& s) {
  std::ostringstream os;
  os << coll_name(s.coll) << (s.max ? "(max)" : "") << " of " << s.bytes << " bytes";
  return os.str();
}

// A collective some members of a group have reached. Its members block there until the
// last arrives, so a group has at most one open at a time (sequence number `seq`).
struct Arrival {
  Signature signature;
  int seq = -1, first_rank = -1, count = 0;
  double ready = 0;
  std::vector<int> ranks;
};

class Engine {
 public:
  Engine(const Plan& p, const core::Graph& g, const EngineOptions& o) : plan_(p), g_(g), opt_(o) {}

  EngineResult run() {
    prepare();
    std::deque<int> ready;
    for (int r = 0; r < plan_.world(); ++r)
      if (active(r)) ready.push_back(r);
    while (!ready.empty() && int(res_.errors.size()) < opt_.max_errors) {
      int r = ready.front();
      ready.pop_front();
      advance(r, ready);
    }
    finish();
    return std::move(res_);
  }

 private:
  struct Rank {
    const Role* role = nullptr;
    const RoleInfo* info = nullptr;
    int dp = 0;
    size_t pc = 0, recorded_pc = 0;  // recorded_pc: instructions before it are in the schedule
    double clock = 0, busy = 0, fb_end = 0;
    double burst =
        0;  // compute seconds since the rank's last collective or receive (CostModel::sync_wait)
    // The variance of the waits this rank's replica paid since the step began, and what
    // collectives across replicas already charged for it (CostModel::replica_drift).
    double drift_var = 0, drift_paid = 0;
    std::vector<char> produced, alive;
    int64_t live = 0;
    std::vector<int> coll_seq;  // group family -> collectives issued on the rank's group of it
    bool blocked = false, done = false;
    // Why a blocked rank waits, spelled only if it never resumes (a deadlock): at
    // instruction `wait_pc`, for a message from rank `wait_peer` with `wait_tag`, or in
    // collective #`wait_seq` on group `wait_group` with `wait_count` members arrived.
    bool wait_recv = false;
    size_t wait_pc = 0;
    int wait_peer = -1, wait_seq = -1, wait_group = -1, wait_count = 0;
    int64_t wait_tag = 0;
  };

  bool active(int r) const { return !opt_.one_replica || plan_.mesh.coord(r).dp == 0; }

  std::string waiting(int r) const {
    const Rank& R = ranks_[size_t(r)];
    if (!R.wait_recv && R.wait_group < 0) return "";  // never blocked
    if (R.wait_recv)
      return where(r, R.wait_pc) + " waits for a message from rank " + std::to_string(R.wait_peer) +
             " tag " + std::to_string(R.wait_tag);
    return where(r, R.wait_pc) + " waits in collective #" + std::to_string(R.wait_seq) +
           " on group " + std::to_string(R.wait_group) + " (" + std::to_string(R.wait_count) +
           " of " + std::to_string(group_members_[size_t(R.wait_group)]) + " members" +
           (opt_.one_replica ? " of data-parallel replica 0" : "") + " arrived)";
  }

  void error(const std::string& e) {
    if (int(res_.errors.size()) < opt_.max_errors) res_.errors.push_back(e);
  }

  std::string where(int r, size_t i) const {
    const Instr& in = ranks_[size_t(r)].role->program[i];
    std::ostringstream os;
    os << "rank " << r << " instruction " << i << " (" << instr_kind_name(in.kind);
    if (in.op >= 0) os << " " << g_.op(in.op).type << " %" << in.op;
    if (!in.part.empty()) os << " " << in.part;
    if (in.mb >= 0) os << " mb " << in.mb;
    os << ")";
    return os.str();
  }

  std::string tensor_name(int r, int t) const {
    const TensorDesc& d = ranks_[size_t(r)].role->tensors[size_t(t)];
    return "tensor " + std::to_string(t) + " (" + (d.value >= 0 ? g_.value(d.value).name : d.name) + ")";
  }

  void prepare() {
    infos_.resize(plan_.roles.size());
    for (size_t k = 0; k < plan_.roles.size(); ++k) {
      const Role& role = plan_.roles[k];
      RoleInfo& info = infos_[k];
      for (size_t t = 0; t < role.tensors.size(); ++t) {
        int x = int(t);
        while (role.tensors[size_t(x)].alias_of >= 0) x = role.tensors[size_t(x)].alias_of;
        info.root.push_back(x);
        info.bytes.push_back(role.tensors[t].bytes);
        if (role.tensors[t].persistent && role.tensors[t].alias_of < 0) info.persistent += role.tensors[t].bytes;
      }
      info.compute.assign(role.program.size(), 0);
      if (!opt_.cost) continue;
      if (!opt_.alone && own_alone_.empty()) {
        if (!opt_.work) own_work_ = plan_work(plan_, g_);
        own_alone_ = durations_alone(plan_, opt_.work ? *opt_.work : own_work_, *opt_.cost);
      }
      const std::vector<double>& alone = (opt_.alone ? *opt_.alone : own_alone_)[k];
      const double sharing = opt_.cost->sharing(plan_.world());
      for (size_t i = 0; i < alone.size(); ++i) info.compute[i] = alone[i] * sharing;
    }
    if (opt_.record) {
      opt_.record->codes.resize(plan_.roles.size());
      for (size_t k = 0; k < plan_.roles.size(); ++k) {
        std::vector<uint8_t>& codes = opt_.record->codes[k];
        codes.clear();
        codes.reserve(plan_.roles[k].program.size());
        for (const Instr& in : plan_.roles[k].program)
          codes.push_back(uint8_t(in.kind) |
                          (in.stage == Stage::kStep ? EngineSchedule::kStepWork : uint8_t(0)));
      }
    }
    const int rpn = opt_.cost ? opt_.cost->ranks_per_node : 1 << 30;
    group_cross_.assign(plan_.groups.size(), 0);
    group_sorted_.resize(plan_.groups.size());
    for (const ProcessGroup& gr : plan_.groups) {
      std::vector<int>& s = group_sorted_[size_t(gr.id)];
      s = gr.ranks;
      std::sort(s.begin(), s.end());
    }
    group_members_.assign(plan_.groups.size(), 0);
    group_replicas_ = replicas_per_group(plan_);
    open_.resize(plan_.groups.size());
    for (const ProcessGroup& gr : plan_.groups)
      for (int r : gr.ranks) {
        if (r / rpn != gr.ranks[0] / rpn) group_cross_[size_t(gr.id)] = 1;
        group_members_[size_t(gr.id)] += active(r);
      }
    ranks_.resize(size_t(plan_.world()));
    res_.ranks.resize(size_t(plan_.world()));
    if (opt_.timeline) res_.timeline.resize(size_t(plan_.world()));
    for (int r = 0; r < plan_.world(); ++r) {
      Rank& R = ranks_[size_t(r)];
      int k = plan_.role_index(r);
      R.role = &plan_.roles[size_t(k)];
      R.info = &infos_[size_t(k)];
      R.dp = plan_.mesh.coord(r).dp;
      if (!active(r)) continue;  // takes its replica-0 twin's results (finish)
      R.coll_seq.assign(plan_.families.size(), 0);
      size_t n = R.role->tensors.size();
      R.produced.assign(n, 0);
      R.alive.assign(n, 0);
      for (size_t t = 0; t < n; ++t) {
        const TensorDesc& d = R.role->tensors[t];
        if (!d.persistent) continue;
        R.produced[t] = 1;
        R.alive[size_t(R.info->root[t])] = 1;
      }
      R.live = R.info->persistent;
      res_.ranks[size_t(r)].persistent_bytes = R.live;
      res_.ranks[size_t(r)].peak_bytes = R.live;
    }
  }

  bool readable(int r, size_t i, int t) {
    Rank& R = ranks_[size_t(r)];
    int root = R.info->root[size_t(t)];
    if (!R.produced[size_t(t)]) {
      error(where(r, i) + " reads " + tensor_name(r, t) + " before it is produced");
      return false;
    }
    if (!R.alive[size_t(root)]) {
      error(where(r, i) + " reads " + tensor_name(r, t) + " after it was freed");
      return false;
    }
    return true;
  }

  void write(int r, size_t i, const Operand& o) {
    Rank& R = ranks_[size_t(r)];
    if (o.accumulate) {
      readable(r, i, o.tensor);
      return;
    }
    int root = R.info->root[size_t(o.tensor)];
    if (!R.alive[size_t(root)]) {
      R.alive[size_t(root)] = 1;
      R.live += R.info->bytes[size_t(root)];
      RankCost& c = res_.ranks[size_t(r)];
      c.peak_bytes = std::max(c.peak_bytes, R.live);
    }
    R.produced[size_t(o.tensor)] = 1;
  }

  void span(int r, double start, double end, const Instr& in) {
    if (!opt_.timeline || end <= start) return;
    res_.timeline[size_t(r)].push_back({start, end, in.kind, in.stage, in.mb, in.chunk,
                                        in.recompute, int32_t(ranks_[size_t(r)].pc)});
  }

  void retire(int r, const Instr& in, double start, double work) {
    Rank& R = ranks_[size_t(r)];
    span(r, start, R.clock, in);
    if (in.stage != Stage::kStep) {
      R.busy += work;
      R.fb_end = std::max(R.fb_end, R.clock);
    }
    ++R.pc;
  }

  void advance(int r, std::deque<int>& ready) {
    Rank& R = ranks_[size_t(r)];
    if (R.done || R.blocked) return;
    const std::vector<Instr>& prog = R.role->program;
    RankCost& cost = res_.ranks[size_t(r)];
    while (R.pc < prog.size()) {
      const size_t i = R.pc;
      const Instr& in = prog[i];
      const double start = R.clock;
      switch (in.kind) {
        case InstrKind::kLoad:
        case InstrKind::kCompute:
        case InstrKind::kLocal: {
          for (const Operand& o : in.in) readable(r, i, o.tensor);
          for (const Operand& o : in.out) write(r, i, o);
          double d = R.info->compute[i];
          R.clock += d;
          R.burst += d;
          cost.compute_s += d;
          retire(r, in, start, d);
          break;
        }
        case InstrKind::kFree: {
          for (const Operand& o : in.in) {
            int root = R.info->root[size_t(o.tensor)];
            if (!R.alive[size_t(root)]) {
              error(where(r, i) + " frees " + tensor_name(r, o.tensor) + " which is not allocated");
              continue;
            }
            R.alive[size_t(root)] = 0;
            R.live -= R.info->bytes[size_t(root)];
          }
          ++R.pc;
          break;
        }
        case InstrKind::kSend: {
          readable(r, i, in.in[0].tensor);
          int peer = plan_.peer_rank(r, in.peer);
          mail_[{r, peer, in.tag}].push_back(
              {in.bytes, R.clock, sends_++, R.burst, R.drift_var, R.drift_paid});
          cost.p2p_bytes += in.bytes;
          if (opt_.cost) {  // the sender's own part (CostModel::send_s); the message left at start
            const double d = opt_.cost->send_s(
                in.bytes, r / opt_.cost->ranks_per_node != peer / opt_.cost->ranks_per_node, plan_.world());
            R.clock += d;
            cost.comm_s += d;
          }
          retire(r, in, start, 0);
          auto w = recv_wait_.find({r, peer, in.tag});
          if (w != recv_wait_.end()) {
            int q = w->second;
            recv_wait_.erase(w);
            ranks_[size_t(q)].blocked = false;
            ready.push_back(q);
          }
          break;
        }
        case InstrKind::kRecv: {
          int peer = plan_.peer_rank(r, in.peer);
          auto it = mail_.find({peer, r, in.tag});
          if (it == mail_.end() || it->second.empty()) {
            R.blocked = true;
            recv_wait_[{peer, r, in.tag}] = r;
            R.wait_recv = true, R.wait_pc = i, R.wait_peer = peer, R.wait_tag = in.tag;
            record_run(r);
            return;
          }
          Message m = it->second.front();
          it->second.pop_front();
          if (it->second.empty()) mail_.erase(it);
          if (opt_.record) {
            opt_.record->recv_send.push_back(m.send);
            opt_.record->recv_peer.push_back(peer);
            opt_.record->recv_bytes.push_back(in.bytes);
          }
          if (m.bytes != in.bytes)
            error(where(r, i) + " receives " + std::to_string(in.bytes) + " bytes but rank " +
                  std::to_string(peer) + " sent " + std::to_string(m.bytes));
          double t = m.time, transfer = 0;
          if (opt_.cost) {
            bool cross = r / opt_.cost->ranks_per_node != peer / opt_.cost->ranks_per_node;
            transfer = opt_.cost->p2p(in.bytes, cross, plan_.world());
            // A message synchronises its two ranks as a collective of two does: it leaves
            // late by the wait of the longer burst (the receiver waits only if it is there
            // first).
            const double w = opt_.cost->message_wait(std::max(m.burst, R.burst), plan_.world());
            transfer += w;
            // The two ranks share one replica's drift from here, this wait's spread added.
            R.drift_var = std::max(R.drift_var, m.drift_var) + opt_.cost->wait_variance(w, 2);
            R.drift_paid = std::max(R.drift_paid, m.drift_paid);
          }
          R.clock = std::max(R.clock, t + transfer);
          R.burst = 0;
          double moving = std::min(transfer, R.clock - start);
          cost.comm_s += moving;
          cost.wait_s += R.clock - start - moving;
          cost.recv_wait_s += R.clock - start - moving;
          write(r, i, in.out[0]);
          retire(r, in, start, 0);
          break;
        }
        case InstrKind::kCollective: {
          record_run(r);
          if (!arrive(r, i, ready)) return;
          break;
        }
      }
    }
    record_run(r);
    R.done = true;
  }

  // The price class of collective `in` on group `gid` (EngineSchedule::coll_class): what
  // collective_seconds reads of it besides the group.
  int price_class(const Instr& in, int gid) {
    const bool dispatch = in.coll == CollKind::kAllToAllV && in.part == "moe.dispatch" &&
                          in.stage == Stage::kForward && !in.recompute;
    const auto key = std::make_tuple(gid, int(in.coll), in.bytes, dispatch ? in.op : -1);
    auto [it, added] = classes_.try_emplace(key, int(opt_.record->class_instr.size()));
    if (added) {
      opt_.record->class_instr.push_back(&in);
      opt_.record->class_group.push_back(gid);
    }
    return it->second;
  }

  // Schedules rank r's instructions retired since the last step, as one step.
  void record_run(int r) {
    Rank& R = ranks_[size_t(r)];
    if (!opt_.record || R.pc == R.recorded_pc) return;
    opt_.record->steps.push_back({r, uint32_t(R.pc)});
    R.recorded_pc = R.pc;
  }

  // Registers rank r at its collective; completes the collective when it is the last
  // member. Returns false when r must wait.
  bool arrive(int r, size_t i, std::deque<int>& ready) {
    Rank& R = ranks_[size_t(r)];
    const Instr& in = R.role->program[i];
    for (const Operand& o : in.in) readable(r, i, o.tensor);
    int gid = plan_.group_id(in.group, R.dp);
    const ProcessGroup& grp = plan_.groups.at(size_t(gid));
    if (!std::binary_search(group_sorted_[size_t(gid)].begin(), group_sorted_[size_t(gid)].end(),
                            r)) {
      error(where(r, i) + " uses group " + std::to_string(gid) + " which does not contain it");
      ++R.pc;
      return true;
    }
    const int seq = R.coll_seq.at(size_t(in.group))++;
    const Signature sig{in.coll, in.reduce == ReduceOp::kMax, in.bytes};
    Arrival& a = open_[size_t(gid)];
    WEFT_CHECK(a.count == 0 || a.seq == seq, "group ", gid, " has collectives #", a.seq,
               " and #", seq, " open at once");
    if (a.count == 0)
      a.signature = sig, a.seq = seq, a.first_rank = r, a.ready = 0;
    else if (!(a.signature == sig))
      error("group " + std::to_string(gid) + ": collective #" + std::to_string(seq) + " is " +
            signature_str(a.signature) + " on rank " + std::to_string(a.first_rank) + " but " +
            signature_str(sig) + " on " + where(r, i) +
            " (members issue collectives in different orders)");
    a.count++;
    a.ready = std::max(a.ready, R.clock);
    a.ranks.push_back(r);
    if (a.count < group_members_[size_t(gid)]) {
      R.blocked = true;
      R.wait_recv = false, R.wait_pc = i, R.wait_seq = seq, R.wait_group = gid,
      R.wait_count = a.count;
      return false;
    }
    double d = opt_.cost ? collective_seconds(plan_, g_, *opt_.cost, in, int(grp.ranks.size()),
                                              group_cross_[size_t(gid)])
                          : 0;
    // The members' bursts did not end together: the wait the longest one's burst brings.
    double burst = 0;
    for (int q : a.ranks) burst = std::max(burst, ranks_[size_t(q)].burst);
    const double w =
        opt_.cost ? opt_.cost->sync_wait(burst, int(grp.ranks.size()), plan_.world()) : 0;
    d += w;
    // The replicas' drift (CostModel::replica_drift): a collective within one replica adds its
    // wait's spread to its members' drift, one across replicas pays the drift not yet paid.
    double drift_var = 0, drift_paid = 0;
    for (int q : a.ranks) {
      drift_var = std::max(drift_var, ranks_[size_t(q)].drift_var);
      drift_paid = std::max(drift_paid, ranks_[size_t(q)].drift_paid);
    }
    if (opt_.cost) {
      const int replicas = group_replicas_[size_t(gid)];
      if (replicas > 1) {
        const double due = opt_.cost->replica_drift(drift_var, replicas);
        if (due > drift_paid) d += due - drift_paid, drift_paid = due;
      } else {
        drift_var += opt_.cost->wait_variance(w, int(grp.ranks.size()));
      }
    }
    double end = a.ready + d;
    if (opt_.record) {
      EngineSchedule& s = *opt_.record;
      s.steps.push_back({-1 - int(s.coll_pricer.size()), 0});
      s.coll_pricer.push_back(r);
      s.coll_class.push_back(price_class(in, gid));
      s.coll_begin.push_back(int(s.coll_ranks.size()));
      s.coll_ranks.insert(s.coll_ranks.end(), a.ranks.begin(), a.ranks.end());
    }
    for (int q : a.ranks) {
      Rank& Q = ranks_[size_t(q)];
      const Instr& qi = Q.role->program[Q.pc];
      double start = Q.clock;
      Q.clock = end;
      Q.burst = 0;
      Q.drift_var = drift_var, Q.drift_paid = drift_paid;
      RankCost& c = res_.ranks[size_t(q)];
      c.comm_s += d;
      c.wait_s += end - start - d;
      c.comm_bytes[int(qi.coll)] += wire_bytes(qi.coll, int(grp.ranks.size()), qi.bytes);
      for (const Operand& o : qi.out) write(q, Q.pc, o);
      retire(q, qi, start, d);
      Q.recorded_pc = Q.pc;  // the collective's step above
      if (q != r) {
        Q.blocked = false;
        ready.push_back(q);
      }
    }
    a.count = 0;
    a.ranks.clear();
    return true;
  }

  void finish() {
    int reported = 0;
    for (int r = 0; r < plan_.world(); ++r) {
      if (!active(r)) continue;
      Rank& R = ranks_[size_t(r)];
      RankCost& c = res_.ranks[size_t(r)];
      c.step_s = R.clock;
      res_.fb_end = std::max(res_.fb_end, R.fb_end);
      if (!R.done && reported++ < 8) error("deadlock: " + waiting(r));
      if (opt_.memory_budget > 0 && c.peak_bytes > opt_.memory_budget)
        error("rank " + std::to_string(r) + " peaks at " + std::to_string(c.peak_bytes) +
              " bytes, over its memory budget of " + std::to_string(opt_.memory_budget) + " bytes");
    }
    for (int r = 0; r < plan_.world(); ++r) {
      if (active(r)) continue;
      const Role& role = *ranks_[size_t(r)].role;
      const int twin = plan_.mesh.rank_of(role.stage, role.lane, 0);
      res_.ranks[size_t(r)] = res_.ranks[size_t(twin)];
      if (opt_.timeline) res_.timeline[size_t(r)] = res_.timeline[size_t(twin)];
    }
    for (auto& [key, q] : mail_)
      if (!q.empty())
        error("rank " + std::to_string(std::get<0>(key)) + " sends tag " + std::to_string(std::get<2>(key)) +
              " to rank " + std::to_string(std::get<1>(key)) + " but it never receives it");
    for (int r = 0; r < plan_.world(); ++r) {
      RankCost& c = res_.ranks[size_t(r)];
      const Role& role = *ranks_[size_t(r)].role;
      const int from = active(r) ? r : plan_.mesh.rank_of(role.stage, role.lane, 0);
      c.bubble = res_.fb_end > 0 ? std::max(0.0, 1.0 - ranks_[size_t(from)].busy / res_.fb_end) : 0;
    }
  }

  const Plan& plan_;
  const core::Graph& g_;
  EngineOptions opt_;
  EngineResult res_;
  std::vector<RoleInfo> infos_;
  PlanWork own_work_;          // when the caller gave none
  PlanDurations own_alone_;
  std::vector<Rank> ranks_;
  std::vector<char> group_cross_;
  std::vector<int> group_members_;  // group -> members the engine runs (all, or replica 0's)
  std::vector<int> group_replicas_;             // group -> data-parallel replicas it spans
  std::vector<std::vector<int>> group_sorted_;  // group -> its ranks, ascending (membership tests)
  std::map<std::tuple<int, int, int64_t>, std::deque<Message>> mail_;
  std::map<std::tuple<int, int, int64_t>, int> recv_wait_;
  std::map<std::tuple<int, int, int64_t, int>, int> classes_;  // price_class's key -> class
  std::vector<Arrival> open_;  // group -> its open collective
  int sends_ = 0;
};

}  // namespace

std::vector<int> replicas_per_group(const Plan& plan) {
  std::vector<int> out(plan.groups.size(), 0);
  for (const ProcessGroup& gr : plan.groups) {
    std::vector<int> dps;
    for (int r : gr.ranks) dps.push_back(plan.mesh.coord(r).dp);
    std::sort(dps.begin(), dps.end());
    out[size_t(gr.id)] = int(std::unique(dps.begin(), dps.end()) - dps.begin());
  }
  return out;
}

EngineResult run_programs(const Plan& plan, const core::Graph& g, const EngineOptions& opt) {
  return Engine(plan, g, opt).run();
}

}  // namespace weft::planner
