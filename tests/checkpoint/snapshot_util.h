// What the snapshot tests write: a rank's layout of whole tensors, and random bytes for it;
// how much of a mapping is mapped in.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/snapshot_writer.h"
#include "core/tensor.h"
#include "parallel/vps.h"

namespace weft::checkpoint {

// A rank's layout holding states 0, 1, ... whole, one local tensor each.
inline parallel::RankLayout whole_tensors(
    const std::vector<std::pair<core::Shape, core::DType>>& tensors) {
  parallel::RankLayout l;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const core::Shape& shape = tensors[i].first;
    l.locals.push_back({int(i), shape, tensors[i].second, -1});
    parallel::StateBox b;
    b.state = int(i);
    b.start.assign(shape.size(), 0);
    b.extent = shape;
    b.local = int(i);
    b.local_start.assign(shape.size(), 0);
    l.boxes.push_back(b);
  }
  return l;
}

// The header of step `step`'s snapshot of `l` as rank 3 of a world of 4, epoch 1, job `job`:
// what the snapshot tests' writers commit.
inline SnapshotMeta rank3_meta(const std::string& job, const parallel::RankLayout& l,
                               int64_t step) {
  SnapshotMeta m;
  m.job_id = job;
  m.epoch = 1;
  m.step = step;
  m.rank = 3;
  m.world = 4;
  m.layout_hash = snapshot_layout_hash(l);
  return m;
}

// Random bytes for `l`'s tensors, the same for the same seed.
inline std::vector<core::Tensor> random_state(const parallel::RankLayout& l, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<core::Tensor> out;
  for (const parallel::LocalTensor& t : l.locals) {
    core::Tensor x = core::Tensor::empty(t.shape, t.dtype);
    auto* b = static_cast<uint8_t*>(x.raw_data());
    for (size_t i = 0; i < x.nbytes(); ++i) b[i] = uint8_t(g());
    out.push_back(x);
  }
  return out;
}

// The KiB of this process's mapping that contains `p` that are mapped in (smaps' Rss); -1
// when no mapping contains it.
inline int64_t rss_kib_of_mapping(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find(':') > line.find(' ')) {
      inside = at >= from && at < to;
      continue;
    }
    long kib = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &kib) == 1) return kib;
  }
  return -1;
}

}  // namespace weft::checkpoint
