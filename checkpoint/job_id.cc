// Job ids: drawn from std::random_device (not from time or pid, which two relaunched jobs on
// two hosts can share) and, on several ranks, broadcast from rank 0.
#include "checkpoint/job_id.h"

#include <cstdint>
#include <cstdio>
#include <random>

#include "core/tensor.h"

namespace weft::checkpoint {

namespace {

std::string hex16(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

}  // namespace

std::string new_job_id() {
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  return hex16(v);
}

std::string agree_job_id(comm::Communicator& world) {
  int64_t mine = 0;
  if (world.rank() == 0) mine = int64_t(std::stoull(new_job_id(), nullptr, 16));
  core::Tensor t = core::Tensor::from_vector<int64_t>({1}, {mine});
  world.broadcast(t).wait();
  return hex16(uint64_t(t.data<int64_t>()[0]));
}

}  // namespace weft::checkpoint
