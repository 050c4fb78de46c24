// Index-set arithmetic for boxes with strided chunks.
#include "planner/box.h"

#include <algorithm>
#include <sstream>

namespace weft::planner {

DimSlice DimSlice::normalised() const {
  DimSlice s = *this;
  if (s.count > 1 && s.size == s.stride) {
    s.size *= s.count;
    s.count = 1;
  }
  if (s.count == 1) s.stride = 0;
  return s;
}

bool DimSlice::contains(const DimSlice& in) const {
  for (int64_t i = 0; i < in.count; ++i) {
    int64_t b = in.start + i * in.stride, e = b + in.size;
    bool inside = false;
    for (int64_t j = 0; j < count && !inside; ++j) {
      int64_t cb = start + j * stride, ce = cb + size;
      inside = b >= cb && e <= ce;
    }
    if (!inside) return false;
  }
  return true;
}

std::optional<DimSlice> DimSlice::part(int64_t k, int64_t n, int64_t groups) const {
  if (n <= 0 || k < 0 || k >= n || groups <= 0) return std::nullopt;
  if (groups == 1) {
    if (count == 1) {
      if (size % n) return std::nullopt;
      return DimSlice{start + k * (size / n), size / n, 1, 0};
    }
    // Whole chunks only: part k takes count/n consecutive chunks, which must be one range.
    if (count % n) return std::nullopt;
    int64_t per = count / n;
    if (per != 1) return std::nullopt;
    return DimSlice{start + k * stride, size, 1, 0};
  }
  if (count == groups) {
    if (size % n) return std::nullopt;
    return DimSlice{start + k * (size / n), size / n, count, stride}.normalised();
  }
  if (count != 1 || size % groups) return std::nullopt;
  int64_t g = size / groups;
  if (g % n) return std::nullopt;
  return DimSlice{start + k * (g / n), g / n, groups, g}.normalised();
}

std::optional<DimSlice> DimSlice::balanced_part(int64_t k, int64_t n) const {
  if (n <= 0 || k < 0 || k >= n || count != 1 || size < n) return std::nullopt;
  const int64_t q = size / n, r = size % n;
  return DimSlice{start + k * q + std::min(k, r), q + (k < r ? 1 : 0), 1, 0};
}

std::optional<DimSlice> DimSlice::padded_part(int64_t k, int64_t n) const {
  if (n <= 0 || k < 0 || k >= n || count != 1) return std::nullopt;
  const int64_t c = (size + n - 1) / n;
  if ((n - 1) * c >= size) return std::nullopt;  // the last part would be empty
  return DimSlice{start + k * c, std::min(c, size - k * c), 1, 0};
}

std::optional<DimSlice> DimSlice::merged(const DimSlice& next) const {
  if (count != next.count || (count > 1 && stride != next.stride)) return std::nullopt;
  if (next.start != start + size) return std::nullopt;
  return DimSlice{start, size + next.size, count, stride}.normalised();
}

Box full_box(const core::Shape& shape) {
  Box b;
  b.reserve(shape.size());
  for (int64_t n : shape) b.push_back(DimSlice{0, n, 1, 0});
  return b;
}

int64_t box_numel(const Box& b) {
  int64_t n = 1;
  for (const DimSlice& d : b) n *= d.numel();
  return n;
}

core::Shape box_shape(const Box& b) {
  core::Shape s;
  for (const DimSlice& d : b) s.push_back(d.numel());
  return s;
}

void cover(Box& whole, const Box& b) {
  for (size_t d = 0; d < whole.size(); ++d) {
    const int64_t lo = std::min(whole[d].start, b[d].start);
    const int64_t hi = std::max(whole[d].start + whole[d].stride * (whole[d].count - 1) + whole[d].size,
                                b[d].start + b[d].stride * (b[d].count - 1) + b[d].size);
    whole[d] = DimSlice::range(lo, hi);
  }
}

bool box_contains(const Box& outer, const Box& inner) {
  if (outer.size() != inner.size()) return false;
  for (size_t d = 0; d < outer.size(); ++d)
    if (!outer[d].contains(inner[d])) return false;
  return true;
}

std::string box_str(const Box& b) {
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < b.size(); ++d) {
    if (d) os << ",";
    const DimSlice& s = b[d];
    os << s.start << ":" << s.start + s.size;
    if (s.count > 1) os << "x" << s.count << "/" << s.stride;
  }
  os << "]";
  return os.str();
}

bool piece_extractable(const Piece& have, const Piece& need) {
  return have.part == need.part && have.parts == need.parts && have.reduce == need.reduce &&
         box_contains(have.box, need.box);
}

const char* reduce_name(ReduceOp r) { return r == ReduceOp::kMax ? "max" : "sum"; }

std::string piece_str(const Piece& p) {
  std::string s = box_str(p.box);
  if (p.parts > 1) s += "+" + std::to_string(p.part) + "/" + std::to_string(p.parts);
  if (p.parts > 1 && p.reduce == ReduceOp::kMax) s += "max";
  return s;
}

}  // namespace weft::planner
