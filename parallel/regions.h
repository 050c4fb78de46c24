// Local pieces of global values: the dense local tensor of a box, copying a region (a box in
// global coordinates) between two pieces, and seeding a parameter piece from the global
// element index so that every layout starts from the same weights.
#pragma once

#include <cstdint>

#include "core/graph/graph.h"
#include "core/tensor.h"
#include "planner/box.h"

namespace weft::parallel {

// The local index of global index `g` inside `s` (chunks laid out one after another), or -1
// when `g` is not in the slice.
int64_t local_index(const planner::DimSlice& s, int64_t g);

// dst[region] (+)= src[region]. `region` is in global coordinates and must lie inside both
// `src_box` and `dst_box`, the boxes the two local tensors hold; the tensors may be strided
// views. dtypes must match (f32, f64, i32, i64). Throws InternalError otherwise.
void copy_region(core::Tensor& dst, const planner::Box& dst_box, const core::Tensor& src,
                 const planner::Box& src_box, const planner::Box& region, bool accumulate = false);

// A view of `root` (holding `root_box`) restricted to `box`, sharing its storage. Supported
// when every dim of `box` is either the root's dim or one contiguous range inside a
// one-chunk root dim (the ZeRO shard and in-place cases); throws NotSupported otherwise.
core::Tensor sub_view(const core::Tensor& root, const planner::Box& root_box,
                      const planner::Box& box);

// Fills the piece `box` of parameter `v` as core::init_parameters fills the whole value:
// element i of the global value (row-major flat index) gets normal(seed, name, i) * std
// or the constant fill, so every shard of every layout holds the same numbers.
void init_parameter_piece(core::Tensor& t, const planner::Box& box, const core::Value& v,
                          uint64_t seed);

// The box `full` with dim `dim` replaced by part k of n (with `groups` strided groups):
// the chunk member k of a collective holds. Throws InternalError when not representable.
planner::Box chunk_box(const planner::Box& full, int dim, int64_t k, int64_t n, int64_t groups);

}  // namespace weft::parallel
