// Extra connections for the state router (see transfer_connections.h).
#include "parallel/transfer_connections.h"

#include <cstdint>

#include "comm/registry.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace weft::parallel {

bool spans_hosts(comm::Communicator& comm, const std::string& address) {
  if (comm.size() <= 1) return false;
  // The address's FNV-1a: the same on every rank and build (std::hash need not be).
  core::Tensor mine =
      core::Tensor::from_vector<int64_t>({1}, {int64_t(core::stable_hash(address))});
  core::Tensor all = core::Tensor::zeros({comm.size()}, core::DType::kI64);
  comm.all_gather(all, mine).wait();
  const int64_t* v = all.data<int64_t>();
  for (int r = 1; r < comm.size(); ++r)
    if (v[r] != v[0]) return true;
  return false;
}

std::vector<std::unique_ptr<comm::Communicator>> connect_more(const comm::CommOptions& o,
                                                              int count) {
  std::vector<std::unique_ptr<comm::Communicator>> out;
  for (int i = 1; i <= count; ++i) {
    comm::CommOptions c = o;
    c.prefix = o.prefix + "/conn" + std::to_string(i);
    out.push_back(comm::make_communicator(comm::BackendKind::kGloo, c));
  }
  return out;
}

}  // namespace weft::parallel
