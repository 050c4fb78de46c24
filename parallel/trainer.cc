// ParallelTrainer: planning, the step loop's scalars, statistics and weights across ranks.
#include "parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

#include "base/check.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "core/exec/executor.h"
#include "core/exec/nonfinite.h"
#include "parallel/regions.h"
#include "planner/planner.h"
#include "planner/validate.h"

namespace weft::parallel {

namespace {

bool is_param_root(const core::Graph& g, const planner::TensorDesc& d) {
  return d.persistent && d.alias_of < 0 && d.value >= 0 &&
         g.value(d.value).role == core::Role::kParameter;
}

// Every rank's contribution concatenated on every rank (sizes differ per rank): f64 for the
// statistics, f32 (the parameters' own type) for the weights.
template <typename T>
std::vector<T> all_gather_values(comm::Communicator& c, const std::vector<T>& mine) {
  core::Tensor n = core::Tensor::from_vector<int64_t>({1}, {int64_t(mine.size())});
  core::Tensor all_n = core::Tensor::empty({c.size()}, core::DType::kI64);
  c.all_gather(all_n, n).wait();
  std::vector<int64_t> counts = all_n.to_vector<int64_t>();
  int64_t total = 0;
  for (int64_t k : counts) total += k;
  const core::DType dt = core::dtype_of<T>();
  core::Tensor in = core::Tensor::empty({std::max<int64_t>(1, int64_t(mine.size()))}, dt);
  std::copy(mine.begin(), mine.end(), in.data<T>());
  core::Tensor out = core::Tensor::empty({std::max<int64_t>(1, total)}, dt);
  comm::AllGatherOptions o;
  o.counts = counts;
  c.all_gather(out.slice(0, 0, total), in.slice(0, 0, int64_t(mine.size())), o).wait();
  std::vector<T> v = out.to_vector<T>();
  v.resize(size_t(total));
  return v;
}

}  // namespace

ParallelTrainer::ParallelTrainer(const core::JobSpec& spec, comm::Communicator& world,
                                 StateInit init)
    : ParallelTrainer(spec, world, init, TrainerParts{}) {}

ParallelTrainer::ParallelTrainer(const core::JobSpec& spec, comm::Communicator& world,
                                 StateInit init, TrainerParts parts)
    : spec_(spec), world_(world), state_pending_(init == StateInit::kDeferred), rank_(world.rank()) {
  if (spec_.train.dtype != "f32")
    throw ConfigError("train.dtype", "'" + spec_.train.dtype +
                                         "' needs device: cuda; the CPU trainer computes in f32");
  const planner::PlanOptions opt = planner::training_plan_options();
  auto t = std::chrono::steady_clock::now();
  auto lap = [&t](double& into) {
    const auto now = std::chrono::steady_clock::now();
    into = std::chrono::duration<double>(now - t).count();
    t = now;
  };
  mg_ = parts.graph
            ? std::move(parts.graph)
            : std::make_shared<const core::ModelGraph>(planner::build_planning_graph(spec_));
  lap(setup_times_.graph);
  if (parts.plan) {
    WEFT_CHECK(parts.plan->world() == world_.size(), "the plan given is for ", parts.plan->world(),
               " ranks, the world has ", world_.size());
    plan_ = std::move(parts.plan);
  } else {
    plan_ = std::make_shared<const planner::Plan>(
        planner::make_plan(spec_, mg_->graph, world_.size(), opt));
  }
  lap(setup_times_.plan);
  planner::check_plan_matches(*plan_, spec_, mg_->graph);
  check_memory_budget();
  lap(setup_times_.check);
  if (parts.groups && parts.groups->fits(world_, *plan_)) {
    groups_ = std::move(parts.groups);
    groups_given_ = true;
  } else {
    if (parts.groups)
      WEFT_DEBUG("trainer", "rank ", rank_,
                 ": the process groups given were built for another plan or communicator; "
                 "splitting them anew");
    parts.groups.reset();  // before the new splits: their connections go first
    groups_ = std::make_unique<ProcessGroups>(world_, *plan_);
  }
  lap(setup_times_.groups);
  exec_ = std::make_unique<RankExecutor>(*plan_, mg_->graph, world_.rank(), world_, *groups_,
                                         state_pending_, parts.persistent);
  lap(setup_times_.executor);
  if (init == StateInit::kSeed) exec_->init_parameters(spec_.train.seed);
  std::vector<int> losses = mg_->aux_losses;
  losses.push_back(mg_->loss);
  exec_->set_loss_values(losses);
  // The arena's big segments from the same allocator as the state: a recycling one keeps
  // their pages when this trainer goes, for the next layout's blocks (an online resize).
  memory_ = std::make_unique<core::ActivationMemory>(spec_.memory.allocator, parts.persistent);
  balance_ = core::MoeBalance::for_model(spec_.model);
  lap(setup_times_.init);
}

ParallelTrainer::~ParallelTrainer() = default;

void ParallelTrainer::check_memory_budget() const {
  std::string text = env_string("WEFT_MEMORY_GIB", "");
  if (text.empty()) return;
  double gib = 0;
  try {
    gib = std::stod(text);
  } catch (const std::exception&) {
    throw ConfigError("WEFT_MEMORY_GIB", "expected a number of GiB per rank, got '" + text + "'");
  }
  if (gib <= 0) return;
  const double unit = double(int64_t(1) << 30);
  planner::ValidationReport rep = planner::validate_plan(*plan_, mg_->graph, int64_t(gib * unit));
  for (size_t r = 0; r < rep.peak_bytes.size(); ++r)
    if (double(rep.peak_bytes[r]) > gib * unit) {
      const planner::Degrees& d = plan_->config.deg;
      std::ostringstream os;
      os.precision(3);
      os << "the layout dp " << d.dp << " x tp " << d.tp << " x pp " << d.pp << " x ep " << d.ep
         << ", zero " << plan_->config.zero << " needs " << double(rep.peak_bytes[r]) / unit
         << " GiB on rank " << r << ", over the budget of " << gib
         << " GiB per rank: shard more (parallel.zero, parallel.tp, parallel.pp), recompute "
            "(parallel.recompute) or use more ranks";
      throw ConfigError("parallel", os.str());
    }
}

void ParallelTrainer::require_state(const char* what) const {
  if (state_pending_)
    throw InternalError(std::string(what) +
                        " on a trainer built with StateInit::kDeferred: the state was never "
                        "provided (adopt_state)");
}

int64_t ParallelTrainer::num_parameters() const {
  int64_t n = 0;
  for (int p : mg_->graph.parameters()) n += core::shape_numel(mg_->graph.value(p).shape);
  return n;
}

core::StepStats ParallelTrainer::step(const core::BatchFn& batch) {
  require_state("step()");
  const int64_t T = spec_.model.seq_len, B = spec_.train.global_batch,
                mb = plan_->config.micro_batch;
  core::StepStats st;
  st.step = step_;
  st.lr = core::learning_rate(spec_.train, step_);
  core::StepScalars s;
  s.loss_scale = double(mb) / double(B);  // d(global mean)/d(a micro-batch's mean)
  s.lr = st.lr;
  s.step = step_;
  s.moe_balance = balance_.get();
  LoadFn load = [&](int value, const planner::Box& box, core::Tensor& out) {
    WEFT_CHECK(value == mg_->tokens || value == mg_->targets,
               "load of a value that is not an input");
    WEFT_CHECK(box.size() == 2 && box[0].count == 1, "load box ", planner::box_str(box));
    const int64_t b0 = box[0].start, n = box[0].size;
    core::Tensor x = core::Tensor::empty({n, T}, core::DType::kI32),
                 y = core::Tensor::empty({n, T}, core::DType::kI32);
    batch(st.step, b0, n, x.data<int32_t>(), y.data<int32_t>());
    planner::Box rows{planner::DimSlice{b0, n, 1, 0}, planner::DimSlice{0, T, 1, 0}};
    copy_region(out, box, value == mg_->tokens ? x : y, rows, box);
  };
  memory_->begin_step(steps_run_++);  // a resumed run starts at step_ > 0 yet traces first
  exec_->set_transient_allocator(&memory_->current());
  // Every rank reports what it holds: (kind, addend, addends, value); kind -1 the loss, -2
  // the gradient norm, k >= 0 the balance loss of MoE layer k. Replicas (tp lanes) repeat an
  // addend; it counts once. Exchanged before this rank changes any state (the executor's
  // before_update): a peer lost here leaves every survivor's state that of the step's start,
  // so a resized job redoes the step and writes its metrics line, never skips it.
  std::vector<double> all;
  auto exchange_statistics = [&] {
    std::vector<double> mine;
    TensorTable& t = exec_->tensors();
    const int norm = mg_->graph.find_value("grad_norm");
    for (size_t i = 0; i < t.size(); ++i) {
      const planner::TensorDesc& d = t.desc(int(i));
      if (d.value < 0 || !t.live(int(i)) || d.alias_of >= 0) continue;
      int kind = d.value == mg_->loss ? -1 : d.value == norm ? -2 : -3;
      for (size_t k = 0; k < mg_->aux_losses.size(); ++k)
        if (d.value == mg_->aux_losses[k]) kind = int(k);
      if (kind == -3) continue;
      mine.insert(mine.end(), {double(kind), double(d.piece.part), double(d.piece.parts),
                               t.read(int(i)).item()});
    }
    all = all_gather_values(world_, mine);
    if (after_exchange_) after_exchange_();
  };
  torn_ = false;
  exchanged_.reset();
  exchanged_values_.clear();
  try {
    exec_->run_step(s, load, [&] {
      exchange_statistics();
      // Every rank now has the step's statistics: kept for a metrics line even if a later
      // collective of this step tears the rank (exchanged_stats()), and for a rank behind.
      exchanged_ = fold_statistics(all, st);
      exchanged_values_ = all;
      if (before_update_) before_update_();
    });
  } catch (...) {
    torn_ = exec_->state_written();
    throw;
  }
  // The rank's state is now complete for the next step.
  ++step_;
  return statistics_of(st.step, all);
}

core::StepStats ParallelTrainer::finish_step(const std::vector<double>& exchanged) {
  if (!can_finish_step())
    throw InternalError(str("finish_step on rank ", rank(), ": step ", step_,
                            " did not stop before its update with a local rest "
                            "(can_finish_step)"));
  const core::StepStats st = statistics_of(step_, exchanged);
  // The clip and the applied decision come from the norm this rank reduced itself; the
  // statistics must be of the same step.
  const double norm = exec_->last_grad_norm();
  const bool same = std::isfinite(norm) ? norm == st.grad_norm : !std::isfinite(st.grad_norm);
  if (!same)
    throw InternalError(str("finish_step on rank ", rank(), ": the statistics given for step ",
                            step_, " have the gradient norm ", st.grad_norm,
                            ", this rank reduced ", norm, ": they are not this step's"));
  exec_->finish_step();
  ++step_;
  exchanged_ = st;
  exchanged_values_ = exchanged;
  return st;
}

core::StepStats ParallelTrainer::statistics_of(int64_t step, const std::vector<double>& all) const {
  core::StepStats st;
  st.step = step;
  st.lr = core::learning_rate(spec_.train, step);
  st = fold_statistics(all, st);
  if (st.applied && !(std::isfinite(st.loss) && std::isfinite(st.aux_loss)))
    throw InternalError("step " + std::to_string(st.step) +
                        ": the loss is not finite but the gradient norm is: the update was "
                        "applied (the executor's non-finite fold missed it)");
  return st;
}

core::StepStats ParallelTrainer::fold_statistics(const std::vector<double>& all,
                                                 core::StepStats st) const {
  std::map<std::pair<int, int>, std::pair<double, double>>
      seen;  // (kind, addend) -> (value, addends)
  for (size_t i = 0; i + 3 < all.size(); i += 4)
    seen[{int(all[i]), int(all[i + 1])}] = {all[i + 3], all[i + 2]};
  for (const auto& [key, vp] : seen) {
    if (key.first == -1)
      st.loss += vp.first / vp.second;
    else if (key.first == -2)
      st.grad_norm = vp.first;
    else
      st.aux_loss += vp.first / vp.second;
  }
  if (balance_ && balance_->mode() == core::MoeBalance::Mode::kGlobalAux)
    st.aux_loss = balance_->global_aux_loss();  // the per-micro-batch outputs are local
  st.tokens = spec_.train.global_batch * spec_.model.seq_len;
  // adamw ran on every rank with the same global norm: finite means applied everywhere.
  st.applied = std::isfinite(st.grad_norm);
  if (!st.applied) st.nonfinite = std::isfinite(st.loss) ? "gradient norm" : "loss";
  return st;
}

std::string ParallelTrainer::first_nonfinite_gradient() {
  const core::Graph& g = mg_->graph;
  std::vector<int> params = g.parameters();
  std::map<int, int> order;  // gradient value -> index of its parameter
  for (size_t k = 0; k < params.size(); ++k)
    order[g.find_value("grad:" + g.value(params[k]).name)] = int(k);
  double first = double(params.size());
  TensorTable& t = exec_->tensors();
  for (size_t i = 0; i < t.size(); ++i) {
    const planner::TensorDesc& d = t.desc(int(i));
    auto it = order.find(d.value);
    if (it == order.end() || d.alias_of >= 0 || !t.live(int(i))) continue;
    if (it->second < first && !core::all_finite(t.read(int(i)))) first = it->second;
  }
  std::vector<double> all = all_gather_values(world_, std::vector<double>{first});
  for (double f : all) first = std::min(first, f);
  return first < double(params.size()) ? g.value(params[size_t(first)]).name : std::string();
}

std::vector<core::Tensor> ParallelTrainer::gather_parameters() {
  const core::Graph& g = mg_->graph;
  std::vector<float> mine;
  TensorTable& t = exec_->tensors();
  for (size_t i = 0; i < t.size(); ++i)
    if (is_param_root(g, t.desc(int(i)))) {
      std::vector<float> v = t.read(int(i)).to_vector<float>();
      mine.insert(mine.end(), v.begin(), v.end());
    }
  std::vector<float> all = all_gather_values(world_, mine);
  std::vector<core::Tensor> full(g.values().size());
  for (int p : g.parameters())
    full[size_t(p)] = core::Tensor::zeros(g.value(p).shape, core::DType::kF32);
  int64_t off = 0;
  for (int r = 0; r < world_.size(); ++r) {
    planner::RankProgram prog = plan_->program(r);
    for (const planner::TensorDesc& d : prog.tensors) {
      if (!is_param_root(g, d)) continue;
      int64_t n = planner::box_numel(d.piece.box);
      std::vector<float> v(all.begin() + off, all.begin() + off + n);
      core::Shape shape = planner::box_shape(d.piece.box);
      core::Tensor piece = core::Tensor::from_vector<float>(shape, v);
      core::Tensor& f = full[size_t(d.value)];
      copy_region(f, planner::full_box(f.shape()), piece, d.piece.box, d.piece.box);
      off += n;
    }
  }
  WEFT_CHECK(off == int64_t(all.size()), "gathered ", all.size(),
             " parameter elements, the plan accounts for ", off);
  return full;
}

core::NamedTensors ParallelTrainer::gather_weights() {
  require_state("gather_weights()");
  std::vector<core::Tensor> full = gather_parameters();
  core::ModelGraph fwd = core::build_model(spec_.model, 1);
  core::GraphExecutor ex(fwd.graph);
  for (int p : fwd.graph.parameters()) {
    int id = mg_->graph.find_value(fwd.graph.value(p).name);
    ex.tensor(p).copy_from(full.at(size_t(id)));
  }
  return core::export_weights(fwd, ex);
}

void ParallelTrainer::load_weights(const core::NamedTensors& w, const std::string& field) {
  require_state("load_weights()");
  core::ModelGraph fwd = core::build_model(spec_.model, 1);
  core::GraphExecutor ex(fwd.graph);
  core::import_weights(fwd, ex, w, field);  // checks names and shapes first
  TensorTable& t = exec_->tensors();
  for (size_t i = 0; i < t.size(); ++i) {
    const planner::TensorDesc& d = t.desc(int(i));
    if (!is_param_root(mg_->graph, d)) continue;
    core::Tensor& f = ex.tensor(fwd.graph.find_value(mg_->graph.value(d.value).name));
    copy_region(t.read(int(i)), d.piece.box, f, planner::full_box(f.shape()), d.piece.box);
  }
}

}  // namespace weft::parallel
