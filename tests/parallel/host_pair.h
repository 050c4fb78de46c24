// Two ranks on two network-namespace hosts (test::VirtualHosts) connected for the router:
// the setup RouterStripes, RouterStripesThroughput and RouterAckCost share.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/registry.h"
#include "comm/store/store.h"
#include "parallel/transfer_connections.h"
#include "tests/support/netns.h"

namespace weft::parallel {

struct HostPairComms {
  comm::CommOptions options;  // rank r's (host: its namespace's address)
  std::unique_ptr<comm::Communicator> comm;
  std::vector<std::unique_ptr<comm::Communicator>> more;  // connections - 1 over the same ranks
};

// Rank `r` of two: its Gloo communicator over `store` and `connections - 1` more
// (transfer_connections.h), all connected on a thread inside r's namespace, where the
// sockets made stay.
inline HostPairComms connect_host_pair(const test::VirtualHosts& hosts, int r, comm::Store& store,
                                       const std::string& prefix,
                                       std::chrono::milliseconds timeout, int connections) {
  HostPairComms p;
  p.options.rank = r, p.options.size = 2, p.options.store = &store, p.options.prefix = prefix;
  p.options.timeout = timeout, p.options.host = hosts.address(r);
  hosts.in_host(r, [&] {
    p.comm = comm::make_communicator(comm::BackendKind::kGloo, p.options);
    p.more = connect_more(p.options, connections - 1);
  });
  return p;
}

}  // namespace weft::parallel
