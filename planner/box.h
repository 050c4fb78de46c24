// Sub-tensors: a piece of a global value is a box (an index set per dim) plus a value split
// (the i-th of n partial addends, combined by a sum or a max). Replicas are equal pieces on
// different devices.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace weft::planner {

// The index set of one dim: `count` chunks of `size` elements, chunk i starting at
// start + i*stride. count == 1 is a plain range; count > 1 arises when a grouped dim such
// as attention's (3 h d) is split by h: every rank holds 3 strided chunks. Normalised so
// that count == 1 implies stride == 0 and adjacent chunks (size == stride) are merged.
struct DimSlice {
  int64_t start = 0, size = 0, count = 1, stride = 0;

  static DimSlice range(int64_t begin, int64_t end) { return {begin, end - begin, 1, 0}; }
  int64_t numel() const { return size * count; }
  DimSlice normalised() const;
  bool operator==(const DimSlice& o) const = default;
  // True when every index of `inner` is an index of this slice.
  bool contains(const DimSlice& inner) const;
  // The k-th of n equal parts, splitting each of `groups` equal groups of this slice
  // (groups 1: a contiguous split of the slice's elements in order). nullopt when the
  // parts are not representable or not equal.
  std::optional<DimSlice> part(int64_t k, int64_t n, int64_t groups = 1) const;
  // The k-th of n contiguous parts of a plain range whose sizes differ by at most one: the
  // first size % n parts hold one element more (256 over 3 = 86, 85, 85). Equals part(k, n)
  // when n divides the size. For the vocabulary, which tp need not divide; nullopt for a
  // strided slice or a part that would be empty.
  std::optional<DimSlice> balanced_part(int64_t k, int64_t n) const;
  // The k-th of n contiguous parts of a plain range as torch.chunk and FSDP cut it: every
  // part ceil(size / n) elements, the last one shorter (64 over 3 = 22, 22, 20). Part k
  // starts at k * ceil(size / n), so the parts of equal holders differ by a fixed shift
  // (ZeRO's uneven shards). Equals part(k, n) when n divides the size; nullopt for a strided
  // slice or when some part would be empty (4 over 3).
  std::optional<DimSlice> padded_part(int64_t k, int64_t n) const;
  // This slice followed by `next` within every chunk; nullopt unless adjacent.
  std::optional<DimSlice> merged(const DimSlice& next) const;
};

using Box = std::vector<DimSlice>;

// How the addends of a value split combine into the value: a sum (partial sums: gradients,
// row-parallel outputs) or an element-wise max (a vocabulary-parallel row max). Also the
// reduction a collective applies (Instr::reduce).
enum class ReduceOp : uint8_t { kSum, kMax };
const char* reduce_name(ReduceOp r);  // "sum", "max"

Box full_box(const core::Shape& shape);
int64_t box_numel(const Box& b);
core::Shape box_shape(const Box& b);  // per dim count*size: the dense local tensor
bool box_contains(const Box& outer, const Box& inner);
// Grows `whole` (plain ranges, one per dim) until it covers every index of `b`: the slice a
// layout conversion works within.
void cover(Box& whole, const Box& b);
std::string box_str(const Box& b);

// A sub-tensor of a global value: `box` holds the addend `part` of `parts` (parts 1: the
// value itself), the addends combining under `reduce`. A whole value (parts 1) always says
// kSum, so that equal pieces compare equal whatever split they came from.
struct Piece {
  Box box;
  int32_t part = 0, parts = 1;
  ReduceOp reduce = ReduceOp::kSum;
  bool operator==(const Piece& o) const = default;
  int64_t numel() const { return box_numel(box); }
  bool partial() const { return parts > 1; }
};
// True when `need` can be cut out of `have` locally: the same addend (of the same
// reduction), a sub-box.
bool piece_extractable(const Piece& have, const Piece& need);
std::string piece_str(const Piece& p);

}  // namespace weft::planner
