// NoWatchProxy: blocking Beast, a thread per client connection, each with its own connection
// to the member (EtcdStore keeps one keep-alive connection per store, and one more while it
// asks a late member for its raft status). Stopping shuts every socket down, which ends the
// threads' blocking reads.
#include "tests/comm/etcd_no_watch_proxy.h"

#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/store/etcd_http.h"

namespace weft::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct NoWatchProxy::Impl {
  Impl(const std::string& member, unsigned status)
      : upstream(comm::parse_etcd_endpoint(member, "proxy member")), refusal(status) {
    acceptor.open(tcp::v4());
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind({asio::ip::make_address("127.0.0.1"), 0});
    acceptor.listen();
    accepting = std::thread([this] { accept_loop(); });
  }

  ~Impl() {
    stop = true;
    ::shutdown(acceptor.native_handle(), SHUT_RDWR);  // ends the blocking accept
    accepting.join();
    {
      std::lock_guard lock(mu);
      for (auto& s : sockets)
        if (s->is_open()) ::shutdown(s->native_handle(), SHUT_RDWR);
    }
    for (auto& t : serving) t.join();
  }

  void accept_loop() {
    for (;;) {
      beast::error_code ec;
      auto client = std::make_shared<tcp::socket>(io);
      acceptor.accept(*client, ec);
      if (ec || stop) return;
      auto member = std::make_shared<tcp::socket>(io);
      std::lock_guard lock(mu);
      sockets.push_back(client);
      sockets.push_back(member);
      serving.emplace_back([this, client, member] {
        serve(*client, *member);
        // Closed under the lock that the destructor's shutdowns take.
        std::lock_guard l(mu);
        beast::error_code ignored;
        client->close(ignored);
        member->close(ignored);
      });
    }
  }

  void serve(tcp::socket& client, tcp::socket& member) {
    beast::flat_buffer from_client, from_member;
    beast::error_code ec;
    bool connected = false;
    for (;;) {
      http::request<http::string_body> req;
      http::read(client, from_client, req, ec);
      if (ec) return;
      if (req.target() == "/v3/watch") {
        ++refused;
        http::response<http::string_body> res{http::status(refusal), req.version()};
        res.set(http::field::content_type, "text/plain");
        res.body() = "no watch here\n";
        res.keep_alive(req.keep_alive());
        res.prepare_payload();
        http::write(client, res, ec);
        if (ec) return;
        continue;
      }
      if (!connected) {
        tcp::resolver resolver(io);
        std::lock_guard lock(mu);  // the destructor's shutdowns read the socket's handle
        asio::connect(member, resolver.resolve(upstream.host, std::to_string(upstream.port)), ec);
        if (ec) return;
        connected = true;
      }
      http::write(member, req, ec);
      if (ec) return;
      http::response<http::string_body> res;
      http::read(member, from_member, res, ec);
      if (ec) return;
      ++passed;
      http::write(client, res, ec);
      if (ec) return;
    }
  }

  const comm::EtcdEndpoint upstream;
  const unsigned refusal;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> refused{0}, passed{0};
  std::mutex mu;
  // Every connection's sockets, kept until the end so that the destructor can shut them down.
  std::vector<std::shared_ptr<tcp::socket>> sockets;
  std::vector<std::thread> serving;
  std::thread accepting;
};

NoWatchProxy::NoWatchProxy(const std::string& member, unsigned status)
    : impl_(std::make_unique<Impl>(member, status)) {}

NoWatchProxy::~NoWatchProxy() = default;

std::string NoWatchProxy::endpoint() const {
  return "127.0.0.1:" + std::to_string(impl_->acceptor.local_endpoint().port());
}

int64_t NoWatchProxy::watches_refused() const { return impl_->refused.load(); }
int64_t NoWatchProxy::forwarded() const { return impl_->passed.load(); }

}  // namespace weft::test
