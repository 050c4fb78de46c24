// EtcdStore in front of a member that has no /v3/watch (a proxy that answers 404 or 501 to
// it and forwards the rest to a real etcd, etcd_no_watch_proxy.h): every blocking call still
// returns when its keys change, by polling; the store asks for a watch once, and says so once
// at debug.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/etcd_store.h"
#include "tests/comm/etcd_cluster.h"
#include "tests/comm/etcd_no_watch_proxy.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::EtcdStore;
using comm::EtcdStoreOptions;
using comm::Millis;
using comm::to_bytes;
using Clock = std::chrono::steady_clock;
using Keys = std::vector<std::string>;

EtcdStoreOptions through(const std::string& endpoint) {
  EtcdStoreOptions o;
  o.endpoints = {endpoint};
  o.prefix = "/p/";
  o.timeout = 20s;
  return o;
}

// get, wait and wait_gone (by an erase and by a lease's end) over `waiter`, each woken by
// `writer`'s change while it waits; returns what went wrong ("" when nothing did). Run by the
// test and, for the log line, in a child process.
std::string blocking_calls_wake(EtcdStore& waiter, EtcdStore& writer, NoWatchProxy& proxy) {
  std::ostringstream wrong;
  auto got = std::async(std::launch::async, [&] { return waiter.get_string("late"); });
  std::this_thread::sleep_for(300ms);
  // Parked 300 ms: polled (a read every 2 ms rising to 50 ms: about ten), not watched.
  const int64_t reads = proxy.forwarded();
  std::this_thread::sleep_for(300ms);
  if (proxy.forwarded() - reads < 3)
    wrong << "a parked get read " << proxy.forwarded() - reads << " times in 300 ms: no poll; ";
  writer.set_string("late", "value");
  if (got.get() != "value") wrong << "get returned another value; ";

  auto waited = std::async(std::launch::async, [&] { waiter.wait({"x", "y"}, 20s); });
  std::this_thread::sleep_for(100ms);
  writer.multi_set({"x", "y"}, {to_bytes("1"), to_bytes("2")});
  waited.get();

  writer.set_string("erased", "v");
  auto gone = std::async(std::launch::async, [&] { return waiter.wait_gone({"erased"}, 20s); });
  std::this_thread::sleep_for(100ms);
  writer.erase("erased");
  if (gone.get() != Keys{"erased"}) wrong << "wait_gone after an erase returned other keys; ";

  const auto set_at = Clock::now();
  writer.set("beat", to_bytes("v"), 1s);  // the test's members grant 1 s leases
  if (waiter.wait_gone({"beat", "late"}, 20s) != Keys{"beat"})
    wrong << "wait_gone on a lease returned other keys; ";
  const double ms = ms_since(set_at);
  if (ms > 2000) wrong << "a 1 s lease's end woke wait_gone after " << ms << " ms; ";
  return wrong.str();
}

class EtcdPollFallback : public ::testing::TestWithParam<unsigned> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    cluster_ = std::make_unique<EtcdCluster>(1);
    proxy_ = std::make_unique<NoWatchProxy>(cluster_->endpoint(0), GetParam());
  }
  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<NoWatchProxy> proxy_;
};

TEST_P(EtcdPollFallback, BlockingCallsWakeByPollAndTheWatchIsAskedForOnce) {
  EtcdStore waiter(through(proxy_->endpoint()));
  EtcdStore writer(through(cluster_->endpoint(0)));
  EXPECT_TRUE(waiter.waits_for_absence()) << "a poll waits for a key to go too";
  EXPECT_EQ(blocking_calls_wake(waiter, writer, *proxy_), "");
  EXPECT_EQ(proxy_->watches_refused(), 1) << "the store asked again after the member said no";
  waiter.set_timeout(100ms);
  EXPECT_THROW(waiter.get("never"), TimeoutError);
  EXPECT_THROW(waiter.wait_gone({"late"}, 100ms), TimeoutError);
  EXPECT_EQ(proxy_->watches_refused(), 1);
}

INSTANTIATE_TEST_SUITE_P(Status, EtcdPollFallback, ::testing::Values(404u, 501u),
                         [](const auto& info) { return "Http" + std::to_string(info.param); });

// The debug line, in a child process of its own (the log reads WEFT_LOG_LEVEL once per
// process): its stderr goes to a file, and the child exits with the number of lines that
// say the member has no watch (100 + something when the calls themselves went wrong).
TEST(EtcdPollFallbackLog, TheMissingWatchIsSaidOnceAtDebug) {
  SKIP_WITHOUT_ETCD();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the log reads the env
  ::setenv("WEFT_LOG_LEVEL", "debug", 1);
  ::setenv("WEFT_LOG_SUBSYS", "etcd", 1);
  const std::string log = ::testing::TempDir() + "etcd_poll_fallback_log.txt";
  EXPECT_EXIT(
      {
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ::dup2(fd, 2);
        int code = 0;
        {
          EtcdCluster cluster(1);
          NoWatchProxy proxy(cluster.endpoint(0), 404);
          EtcdStore waiter(through(proxy.endpoint()));
          EtcdStore writer(through(cluster.endpoint(0)));
          if (!blocking_calls_wake(waiter, writer, proxy).empty()) code = 100;
        }
        std::ifstream in(log);
        for (std::string line; std::getline(in, line);)
          if (line.find("HTTP 404") != std::string::npos &&
              line.find("blocking reads poll instead") != std::string::npos)
            ++code;
        std::_Exit(code);
      },
      ::testing::ExitedWithCode(1), "");
  ::unsetenv("WEFT_LOG_LEVEL");
  ::unsetenv("WEFT_LOG_SUBSYS");
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("/v3/watch"), std::string::npos) << text.str();
  std::remove(log.c_str());
}

}  // namespace
}  // namespace weft::test
