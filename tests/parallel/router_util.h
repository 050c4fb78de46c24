// Real bytes for the router's multi-process tests: every element of every state gets a
// value defined by its global coordinates, so a destination can be checked on its own.
#pragma once

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "parallel/vps.h"
#include "tests/parallel/vps_util.h"

namespace weft::parallel::test_util {

// The value of element `flat` of state `id`: distinct across states and elements.
inline double truth(StateId id, int64_t flat) { return double(id) * 100000.0 + double(flat) * 0.5; }

inline void fill(const StateSpace& space, const RankLayout& rl, std::vector<core::Tensor>& locals) {
  for (const StateBox& b : rl.boxes) {
    const StateTensor& st = space.at(b.state);
    core::Tensor& x = locals[size_t(b.local)];
    const core::Shape& ls = rl.locals[size_t(b.local)].shape;
    std::vector<int64_t> rel(b.start.size());
    for (size_t d = 0; d < rel.size(); ++d) rel[d] = b.local_start[d];
    std::vector<int64_t> globals;
    test_util::for_each_element(st.shape, b.start, b.extent,
                                [&](int64_t f) { globals.push_back(f); });
    size_t i = 0;
    test_util::for_each_element(ls, rel, b.extent, [&](int64_t lf) {
      double v = truth(b.state, globals[i++]);
      if (x.dtype() == core::DType::kF32)
        x.data<float>()[lf] = float(v);
      else if (x.dtype() == core::DType::kF64)
        x.data<double>()[lf] = v;
      else
        x.data<int64_t>()[lf] = int64_t(v);
    });
  }
}

// Count of elements that differ from the truth.
inline int64_t mismatches(const StateSpace& space, const RankLayout& rl,
                          const std::vector<core::Tensor>& locals) {
  std::vector<core::Tensor> expect = allocate_locals(rl);
  fill(space, rl, expect);
  int64_t bad = 0;
  for (size_t l = 0; l < locals.size(); ++l) {
    if (!locals[l].defined()) return -1;
    core::Tensor a = locals[l].contiguous(), e = expect[l];
    bad += std::memcmp(a.raw_data(), e.raw_data(), a.nbytes()) != 0;
  }
  return bad;
}

// One f32 parameter of `shape`, the only state of its space.
inline StateSpace one_state(core::Shape shape) {
  core::Graph g;
  core::Value v;
  v.name = "w";
  v.shape = std::move(shape);
  v.dtype = core::DType::kF32;
  v.role = core::Role::kParameter;
  v.persistent = true;
  g.add_value(v);
  return StateSpace::from_graph(g);
}

inline void hold(Layout& l, int rank, std::vector<int64_t> start, std::vector<int64_t> extent) {
  RankLayout& rl = l.ranks[size_t(rank)];
  rl.locals.push_back(LocalTensor{0, extent, core::DType::kF32, -1});
  rl.boxes.push_back(StateBox{0, std::move(start), extent, int(rl.locals.size()) - 1,
                              std::vector<int64_t>(extent.size(), 0)});
}

// Both plans' layouts over the union world, ranks kept.
inline std::pair<Layout, Layout> layouts(const StateSpace& space, const core::JobSpec& spec,
                                         Degrees from, Degrees to) {
  Layout a = layout_of(space, plan_for(spec, from)), b = layout_of(space, plan_for(spec, to));
  const int world = std::max(a.world(), b.world());
  auto ids = [](int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[size_t(i)] = i;
    return v;
  };
  return {remap_ranks(a, ids(a.world()), world), remap_ranks(b, ids(b.world()), world)};
}

}  // namespace weft::parallel::test_util
