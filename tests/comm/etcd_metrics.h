// What a test reads of an etcd member and of its own process: counters and gauges of the
// member's Prometheus page (/metrics: watchers, range reads, slow watchers), and the entries
// of a /proc/self directory (descriptors, threads) to show that a wait left none behind.
#pragma once

#include <dirent.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/store/etcd_http.h"

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

}  // namespace weft::test
