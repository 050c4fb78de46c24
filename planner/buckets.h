// How gradients (and ZeRO's parameter collectives) are split into buckets: one rule, which
// the lowering follows as it adds each tensor (lower_step.cc's bucket_add) and the search's
// stage model counts from the tensors' sizes (stage_cost.cc), both at the job's
// ParallelConfig::bucket_bytes.
#pragma once

#include <cstdint>
#include <vector>

namespace weft::planner {

// A bucket goes out once it holds at least `bucket_bytes`.
inline bool bucket_full(double bytes, int64_t bucket_bytes) {
  return bytes >= double(bucket_bytes);
}

// The buckets that tensors of these sizes (bytes), added in this order, fill: one each time
// the open bucket is full, and one for what is left at the end; 0 for no tensor.
inline int64_t bucket_count(const std::vector<double>& sizes, int64_t bucket_bytes) {
  int64_t full = 0;
  double open = 0;
  bool any = false;
  for (double s : sizes) {
    open += s, any = true;
    if (bucket_full(open, bucket_bytes)) ++full, open = 0, any = false;
  }
  return full + (any ? 1 : 0);
}

}  // namespace weft::planner
