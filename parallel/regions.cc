// Region copies between local pieces, shard views and layout-independent parameter init.
#include "parallel/regions.h"

#include <cstring>
#include <vector>

#include "base/error.h"
#include "core/rng.h"

namespace weft::parallel {

using planner::Box;
using planner::DimSlice;

int64_t local_index(const DimSlice& s, int64_t g) {
  for (int64_t c = 0; c < s.count; ++c) {
    int64_t b = s.start + c * s.stride;
    if (g >= b && g < b + s.size) return c * s.size + (g - b);
  }
  return -1;
}

namespace {

// Global indices of a slice, in local order.
std::vector<int64_t> indices(const DimSlice& s) {
  std::vector<int64_t> out;
  out.reserve(size_t(s.numel()));
  for (int64_t c = 0; c < s.count; ++c)
    for (int64_t i = 0; i < s.size; ++i) out.push_back(s.start + c * s.stride + i);
  return out;
}

template <typename T>
void copy_typed(char* dst, const std::vector<std::vector<int64_t>>& doff, const char* src,
                const std::vector<std::vector<int64_t>>& soff, bool accumulate) {
  const size_t nd = doff.size();
  std::vector<size_t> it(nd, 0);
  const std::vector<int64_t>& dl = doff[nd - 1];
  const std::vector<int64_t>& sl = soff[nd - 1];
  // Gradient buckets and shards copy whole rows: the last dim is then a run of consecutive
  // elements on both sides, copied as a block.
  bool contiguous = !dl.empty();
  for (size_t i = 1; contiguous && i < dl.size(); ++i)
    contiguous = dl[i] == dl[0] + int64_t(i) && sl[i] == sl[0] + int64_t(i);
  for (;;) {
    int64_t db = 0, sb = 0;
    for (size_t d = 0; d + 1 < nd; ++d) db += doff[d][it[d]], sb += soff[d][it[d]];
    T* dp = reinterpret_cast<T*>(dst) + db;
    const T* sp = reinterpret_cast<const T*>(src) + sb;
    if (contiguous) {  // one run of the last dim on both sides: no index lookups
      T* d = dp + dl[0];
      const T* q = sp + sl[0];
      const size_t n = dl.size();
      if (accumulate)
        for (size_t i = 0; i < n; ++i) d[i] += q[i];
      else
        std::memmove(d, q, n * sizeof(T));
    } else if (accumulate)
      for (size_t i = 0; i < dl.size(); ++i) dp[dl[i]] += sp[sl[i]];
    else
      for (size_t i = 0; i < dl.size(); ++i) dp[dl[i]] = sp[sl[i]];
    // Odometer over every dim but the last.
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++it[d] < doff[d].size()) break;
      it[d] = 0;
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

}  // namespace

void copy_region(core::Tensor& dst, const Box& dst_box, const core::Tensor& src, const Box& src_box,
                 const Box& region, bool accumulate) {
  WEFT_CHECK(dst.dtype() == src.dtype(), "copy_region: dtypes differ");
  WEFT_CHECK(dst_box.size() == region.size() && src_box.size() == region.size(),
             "copy_region: rank mismatch ", planner::box_str(dst_box), " ",
             planner::box_str(src_box), " ", planner::box_str(region));
  WEFT_CHECK(
      dst.numel() == planner::box_numel(dst_box) && src.numel() == planner::box_numel(src_box),
      "copy_region: tensor sizes do not match their boxes");
  if (planner::box_numel(region) == 0) return;
  // Scalars stored as shape () or (1): treat as one dim of one element.
  const size_t nd = std::max<size_t>(region.size(), 1);
  std::vector<std::vector<int64_t>> doff(nd), soff(nd);
  for (size_t d = 0; d < region.size(); ++d) {
    int64_t ds = dst.dim() == int64_t(region.size()) ? dst.strides()[d] : 1;
    int64_t ss = src.dim() == int64_t(region.size()) ? src.strides()[d] : 1;
    for (int64_t g : indices(region[d])) {
      int64_t dl = local_index(dst_box[d], g), sl = local_index(src_box[d], g);
      WEFT_CHECK(dl >= 0 && sl >= 0, "copy_region: region ", planner::box_str(region),
                 " is not inside ", planner::box_str(dst_box), " and ", planner::box_str(src_box));
      doff[d].push_back(dl * ds);
      soff[d].push_back(sl * ss);
    }
  }
  if (region.empty()) doff[0] = soff[0] = {0};
  char* dp = static_cast<char*>(dst.raw_data());
  const char* sp = static_cast<const char*>(src.raw_data());
  switch (dst.dtype()) {
    case core::DType::kF32:
      copy_typed<float>(dp, doff, sp, soff, accumulate);
      break;
    case core::DType::kF64:
      copy_typed<double>(dp, doff, sp, soff, accumulate);
      break;
    case core::DType::kI32:
      copy_typed<int32_t>(dp, doff, sp, soff, accumulate);
      break;
    case core::DType::kI64:
      copy_typed<int64_t>(dp, doff, sp, soff, accumulate);
      break;
    default:
      throw NotSupported(std::string("copy_region: dtype ") + core::dtype_name(dst.dtype()));
  }
}

core::Tensor sub_view(const core::Tensor& root, const Box& root_box, const Box& box) {
  WEFT_CHECK(root_box.size() == box.size(), "sub_view: rank mismatch");
  core::Tensor t = root;
  for (size_t d = 0; d < box.size(); ++d) {
    const DimSlice &r = root_box[d], &b = box[d];
    if (r == b) continue;
    if (r.count != 1 || b.count != 1 || !r.contains(b))
      throw NotSupported("sub_view of " + planner::box_str(box) + " in " +
                         planner::box_str(root_box));
    t = t.slice(int64_t(d), b.start - r.start, b.size);
  }
  return t;
}

void init_parameter_piece(core::Tensor& t, const Box& box, const core::Value& v, uint64_t seed) {
  WEFT_CHECK(t.is_contiguous() && t.dtype() == core::DType::kF32, "init: parameter piece of '",
             v.name, "' must be contiguous f32");
  float* out = t.data<float>();
  const int64_t n = t.numel();
  if (v.init_std <= 0.0f) {
    for (int64_t i = 0; i < n; ++i) out[i] = v.init_fill;
    return;
  }
  core::CounterRng rng(seed, core::stable_hash(v.name));
  // Global row-major strides of the value; each local element maps back through the box.
  const size_t nd = box.size();
  std::vector<int64_t> gstride(nd, 1);
  for (size_t d = nd; d-- > 1;) gstride[d - 1] = gstride[d] * v.shape[d];
  std::vector<std::vector<int64_t>> gidx(nd);
  for (size_t d = 0; d < nd; ++d) gidx[d] = indices(box[d]);
  std::vector<size_t> it(nd, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t g = 0;
    for (size_t d = 0; d < nd; ++d) g += gidx[d][it[d]] * gstride[d];
    out[i] = rng.normal(uint64_t(g)) * v.init_std;
    for (size_t d = nd; d-- > 0;) {
      if (++it[d] < gidx[d].size()) break;
      it[d] = 0;
    }
  }
}

Box chunk_box(const Box& full, int dim, int64_t k, int64_t n, int64_t groups) {
  WEFT_CHECK(dim >= 0 && size_t(dim) < full.size(), "chunk_box: dim ", dim, " of ",
             planner::box_str(full));
  auto p = full[size_t(dim)].part(k, n, groups);
  WEFT_CHECK(p.has_value(), "chunk_box: part ", k, " of ", n, " (groups ", groups, ") of ",
             planner::box_str(full), " along dim ", dim);
  Box b = full;
  b[size_t(dim)] = *p;
  return b;
}

}  // namespace weft::parallel
