// Job ids: drawn from std::random_device (not from time or pid, which two relaunched jobs on
// two hosts can share) and, on several ranks, broadcast from rank 0.
#include "checkpoint/job_id.h"

#include <cstdint>
#include <cstdio>
#include <random>

#include <openssl/evp.h>

#include "base/env.h"
#include "base/error.h"
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

std::string job_id_for_run(const std::string& run_id) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(run_id.data(), run_id.size(), digest, &n, EVP_sha256(), nullptr) != 1 || n < 8)
    throw InternalError("SHA-256 of the run id failed (OpenSSL)");
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | digest[i];
  return hex16(v);
}

std::string this_job_id() {
  const std::string run_id = env_string("TORCHELASTIC_RUN_ID", "");
  return run_id.empty() ? new_job_id() : job_id_for_run(run_id);
}

std::string agree_job_id(comm::Communicator& world) {
  int64_t mine = 0;
  if (world.rank() == 0) mine = int64_t(std::stoull(this_job_id(), nullptr, 16));
  core::Tensor t = core::Tensor::from_vector<int64_t>({1}, {mine});
  world.broadcast(t).wait();
  return hex16(uint64_t(t.data<int64_t>()[0]));
}

}  // namespace weft::checkpoint
