// The layout-invariance harness: reference in the parent, ranks in forked children, results
// back through a file that rank 0 writes.
#include "tests/parallel/layout_harness.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/log.h"
#include "comm/registry.h"
#include "core/cpu/kernels.h"
#include "core/data/dataset.h"
#include "core/exec/trainer.h"
#include "core/io/safetensors.h"
#include "parallel/trainer.h"
#include "planner/planner.h"
#include "tests/support/multiprocess.h"

namespace weft::test {

namespace fs = std::filesystem;

core::JobSpec layout_spec(const LayoutCase& c) {
  std::vector<std::string> o = c.overrides;
  o.push_back("train.threads=1");
  o.push_back("train.eval_every=0");
  o.push_back("train.steps=" + std::to_string(c.steps));
  return core::load_job_spec(std::string(WEFT_SOURCE_DIR) + "/configs/" + c.config, o);
}

namespace {

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

// Normwise relative error of the whole parameter vector, max |w - ref| / max |ref| over every
// element. Per tensor it would be ill-conditioned: gradients that vanish mathematically
// (the key bias: softmax ignores a constant shift) are pure rounding noise that AdamW's
// normalisation turns into lr-sized steps whichever order the sums ran in.
double weight_dev(const core::NamedTensors& got, const core::NamedTensors& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double diff = 0, scale = 1e-12;
  for (const auto& [name, r] : ref) {
    auto it = got.find(name);
    if (it == got.end() || it->second.shape() != r.shape()) return INFINITY;
    std::vector<float> a = it->second.to_vector<float>(), b = r.to_vector<float>();
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
      scale = std::max(scale, std::fabs(double(b[i])));
    }
    if (std::getenv("WEFT_LAYOUT_VERBOSE") && d > 1e-7)
      std::printf("  %s: max |diff| %.3g\n", name.c_str(), d);
    diff = std::max(diff, d);
  }
  return diff / scale;
}

}  // namespace

LayoutOutcome run_layout(const LayoutCase& c) {
  LayoutOutcome out;
  core::JobSpec spec = layout_spec(c);
  core::cpu::set_num_threads(1);  // no OpenMP threads in the parent we fork from
  core::data::TokenDataset data = core::data::TokenDataset::load(spec);
  auto batch = [&](int64_t s, int64_t b0, int64_t n, int32_t* x, int32_t* y) {
    data.fill_train(s, b0, n, x, y);
  };

  std::vector<core::StepStats> ref;
  core::NamedTensors ref_w;
  {
    core::JobSpec single = spec;
    single.parallel = core::ParallelSpec();
    core::Trainer t(single);
    for (int s = 0; s < c.steps; ++s) ref.push_back(t.step(batch));
    ref_w = t.weights();
  }
  fs::path dir = fs::temp_directory_path() / ("weft_layout_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string losses = (dir / "losses.txt").string(),
                    weights = (dir / "w.safetensors").string();
  fs::remove(losses);
  fs::remove(weights);

  RunOptions ro;
  ro.deadline = std::chrono::milliseconds(400'000);
  RunResult r = run_ranks(
      c.world,
      [&](RankContext& ctx) {
        log_set_rank(ctx.rank());
        RankWorld world = gloo_world(ctx, "layout");
        parallel::TrainerParts parts;
        if (c.cost) {
          planner::PlanOptions po;
          po.simulate = false;
          po.cost = *c.cost;
          parts.graph = std::make_shared<const core::ModelGraph>(planner::build_planning_graph(spec));
          parts.plan = std::make_shared<const planner::Plan>(
              planner::make_plan(spec, parts.graph->graph, c.world, po));
        }
        parallel::ParallelTrainer pt(spec, *world.comm, parallel::StateInit::kSeed, std::move(parts));
        std::ostringstream os;
        os.precision(17);
        for (int s = 0; s < c.steps; ++s) {
          core::StepStats st = pt.step(batch);
          os << st.loss << " " << st.grad_norm << " " << st.aux_loss << "\n";
        }
        core::NamedTensors w = pt.gather_weights();
        if (ctx.rank() == 0) {
          core::io::save_safetensors(weights, w);
          std::ofstream(losses) << os.str();
        }
      },
      ro);
  out.ran = true;
  if (!r.ok()) {
    out.failure = r.summary();
    return out;
  }
  std::ifstream in(losses);
  double l, n, a;
  size_t s = 0;
  while (in >> l >> n >> a) {
    out.losses.push_back(l);
    if (std::getenv("WEFT_LAYOUT_VERBOSE") && s < ref.size())
      std::printf("  step %zu: loss %.9g (ref %.9g) norm %.9g (ref %.9g) aux %.9g (ref %.9g)\n", s,
                  l, ref[s].loss, n, ref[s].grad_norm, a, ref[s].aux_loss);
    if (s < ref.size()) {
      out.reference.push_back(ref[s].loss);
      out.max_loss_rel = std::max(out.max_loss_rel, rel(l, ref[s].loss));
      out.max_norm_rel = std::max(out.max_norm_rel, rel(n, ref[s].grad_norm));
      if (ref[s].aux_loss != 0 || a != 0)
        out.max_aux_rel = std::max(out.max_aux_rel, rel(a, ref[s].aux_loss));
    }
    ++s;
  }
  if (s != ref.size())
    out.failure =
        "rank 0 reported " + std::to_string(s) + " steps of " + std::to_string(ref.size());
  else
    out.max_weight_rel = weight_dev(core::io::load_safetensors(weights, "weights"), ref_w);
  fs::remove_all(dir);
  return out;
}

void expect_invariant(const LayoutCase& c, const LayoutOutcome& o) {
  ASSERT_TRUE(o.ran);
  ASSERT_TRUE(o.failure.empty()) << o.failure;
  std::string sets;
  for (const std::string& s : c.overrides) sets += " " + s;
  std::printf(
      "[layout] %-16s world %d%s: %d steps, max rel dev loss %.3g, grad norm %.3g, aux %.3g, "
      "weights %.3g\n",
      c.config.c_str(), c.world, sets.c_str(), c.steps, o.max_loss_rel, o.max_norm_rel,
      o.max_aux_rel, o.max_weight_rel);
  EXPECT_LE(o.max_loss_rel, c.tolerance.scalars);
  EXPECT_LE(o.max_norm_rel, c.tolerance.scalars);
  EXPECT_LE(o.max_aux_rel, c.tolerance.scalars);
  EXPECT_LE(o.max_weight_rel, c.tolerance.weights);
  // The run must be a real training run, not a constant: the loss moves.
  ASSERT_GE(o.losses.size(), 2u);
  EXPECT_NE(o.losses.front(), o.losses.back());
}

}  // namespace weft::test
