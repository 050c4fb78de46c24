// Under mpirun and srun rank 0 serves the store on a port derived from the job's id. Anything
// on the machine may hold that port (a connection's local port, a stranger's listener,
// another job's store): rank 0 then serves on the job's next agreed port and the other ranks
// find it there by the job's name. Before, rank 0 died with "bind: Address already in use".
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <thread>

#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "core/tensor.h"
#include "parallel/launch_env.h"

namespace weft::parallel {
namespace {

TEST(AgreedStorePort, EveryRankDerivesTheSameDistinctPortsFromTheJob) {
  LaunchEnv zero, one;
  zero.store_job = one.store_job = "prterun-host-4242@1";
  zero.rank = 0;
  one.rank = 1;
  std::vector<uint16_t> a = agreed_store_ports(zero), b = agreed_store_ports(one);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::set<uint16_t>(a.begin(), a.end()).size(), a.size());
  EXPECT_GE(a.size(), size_t(kAgreedPortTries - 1));  // a hash collision may merge two
  for (uint16_t p : a) {
    EXPECT_GE(p, 20000);
    EXPECT_LT(p, 40000);
  }
  LaunchEnv other = zero;
  other.store_job = "prterun-host-4243@1";
  EXPECT_NE(agreed_store_ports(other), a);
  // A port the user gave is the only one.
  LaunchEnv given;
  given.store_port = 31234;
  EXPECT_EQ(agreed_store_ports(given), std::vector<uint16_t>{31234});
}

// A TCP socket on 127.0.0.1:port, bound (and listening when asked); -1 when the port is taken.
int hold_port(uint16_t port, bool listening) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      (listening && ::listen(fd, 16) != 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The job's first three agreed ports are taken: one bound by a socket that does not listen (a
// connection's local port), one by a listener that never answers, one by another job's store.
// Both ranks still meet, on the fourth, and their world works.
TEST(AgreedStorePort, RanksMeetPastPortsThatOthersHold) {
  LaunchEnv env;
  env.launcher = "mpirun";
  env.world = 2;
  std::vector<uint16_t> ports;
  int bound = -1, mute = -1;
  std::unique_ptr<comm::TCPStoreServer> stranger;
  // A job name whose first four ports are free now (other tests may hold some).
  for (int attempt = 0; attempt < 50 && !stranger; ++attempt) {
    env.store_job =
        "agreed-port-test-" + std::to_string(::getpid()) + "-" + std::to_string(attempt);
    ports = agreed_store_ports(env);
    int probe = hold_port(ports[3], true);
    if (probe < 0) continue;
    ::close(probe);
    bound = hold_port(ports[0], false);
    mute = bound < 0 ? -1 : hold_port(ports[1], true);
    if (bound >= 0 && mute >= 0) {
      try {
        comm::TCPStoreServerOptions so;
        so.port = ports[2];
        stranger = std::make_unique<comm::TCPStoreServer>(so);
        comm::TCPStore(comm::TCPStoreOptions{"127.0.0.1", ports[2], comm::Millis(5000), ""})
            .set_string("weft/store_job", "some-other-job");
        break;
      } catch (const comm::AddressInUseError&) {
      }
    }
    if (bound >= 0) ::close(bound);
    if (mute >= 0) ::close(mute);
    bound = mute = -1;
  }
  ASSERT_TRUE(stranger) << "no job name with four free agreed ports";
  env.store_port = ports[0];

  std::vector<std::string> errors(2);
  std::vector<uint16_t> met(2, 0);
  std::vector<float> sums(2, 0);
  auto rank_main = [&](int rank) {
    try {
      LaunchEnv e = env;
      e.rank = rank;
      e.host_store = rank == 0;
      WorkerWorld w(e, comm::Millis(30000));
      met[size_t(rank)] = w.env().store_port;
      core::Tensor t = core::Tensor::from_vector<float>({1}, {float(rank + 1)});
      w.comm().all_reduce(t, {}).wait();
      sums[size_t(rank)] = t.data<float>()[0];
    } catch (const std::exception& ex) {
      errors[size_t(rank)] = ex.what();
    }
  };
  std::thread one(rank_main, 1);
  rank_main(0);
  one.join();
  ::close(bound);
  ::close(mute);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(met[0], ports[3]);
  EXPECT_EQ(met[1], ports[3]);
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 3.0f);
}

}  // namespace
}  // namespace weft::parallel
