// What a test reads of an etcd member and of its own process: counters and gauges of the
// member's Prometheus page (/metrics: watchers, watches made, range reads, slow watchers), and the
// entries of a /proc/self directory (descriptors, threads) to show that a wait left none behind;
// and the fixture of the tests that park EtcdStore calls on one member (watch, wait_gone).
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/store/etcd_http.h"
#include "comm/store/etcd_store.h"
#include "tests/comm/etcd_cluster.h"
#include "tests/support/eventually.h"

namespace weft::test {

// Counters or gauges of one scrape of the member's Prometheus page (-1 where not there).
inline std::vector<double> etcd_metrics(const std::string& endpoint,
                                        const std::vector<std::string>& names) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  const comm::EtcdEndpoint ep = comm::parse_etcd_endpoint(endpoint, "test");
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  boost::asio::ip::tcp::socket socket(io);
  boost::asio::connect(socket, resolver.resolve(ep.host, std::to_string(ep.port)));
  http::request<http::string_body> req{http::verb::get, "/metrics", 11};
  req.set(http::field::host, ep.text());
  http::write(socket, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  std::vector<double> out(names.size(), -1);
  std::istringstream lines(res.body());
  for (std::string line; std::getline(lines, line);)
    for (size_t i = 0; i < names.size(); ++i)
      if (line.rfind(names[i] + " ", 0) == 0) out[i] = std::stod(line.substr(names[i].size() + 1));
  return out;
}

inline double etcd_metric(const std::string& endpoint, const std::string& name) {
  return etcd_metrics(endpoint, {name})[0];
}

// Entries of a /proc/self directory (fd, task), less the one opendir holds for fd.
inline int count_entries(const char* dir) {
  int n = 0;
  DIR* d = ::opendir(dir);
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// etcd's counters the wait tests read.
inline constexpr const char* kEtcdWatchers = "etcd_debugging_mvcc_watcher_total";
inline constexpr const char* kEtcdRanges = "etcd_debugging_mvcc_range_total";
// Watch streams the member has opened so far, one per EtcdWatch (each /v3/watch request of
// the gateway is a gRPC Watch stream): the count of watches made, where watcher_total is the
// count held now.
inline constexpr const char* kEtcdWatchStreamsStarted =
    "grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\","
    "grpc_type=\"bidi_stream\"}";

// One etcd member (skipped without etcd) and clients of it under `prefix`.
class EtcdOneMemberTest : public ::testing::Test {
 protected:
  explicit EtcdOneMemberTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    cluster_ = std::make_unique<EtcdCluster>(1);
  }

  std::unique_ptr<comm::EtcdStore> client(comm::Millis timeout = std::chrono::seconds(20)) {
    comm::EtcdStoreOptions o;
    o.endpoints = cluster_->endpoints();
    o.prefix = prefix_;
    o.timeout = timeout;
    return std::make_unique<comm::EtcdStore>(o);
  }

  double watchers() { return etcd_metric(cluster_->endpoint(0), kEtcdWatchers); }
  double ranges() { return etcd_metric(cluster_->endpoint(0), kEtcdRanges); }
  double watches_made() { return etcd_metric(cluster_->endpoint(0), kEtcdWatchStreamsStarted); }

  // This process's descriptors and threads now; expect_nothing_left() compares with them.
  void count_before() {
    fds_ = count_entries("/proc/self/fd");
    threads_ = count_entries("/proc/self/task");
  }
  // What the waits since count_before() left: no descriptor (a watch's connection), no
  // thread, no watcher on the member.
  void expect_nothing_left() {
    EXPECT_EQ(count_entries("/proc/self/fd"), fds_) << "a watch's connection stayed open";
    EXPECT_TRUE(eventually([&] { return count_entries("/proc/self/task") == threads_; }))
        << count_entries("/proc/self/task") << " threads, " << threads_ << " before";
    EXPECT_TRUE(eventually([&] { return watchers() == 0; }));
  }

  std::unique_ptr<EtcdCluster> cluster_;

 private:
  std::string prefix_;
  int fds_ = 0, threads_ = 0;
};

}  // namespace weft::test
