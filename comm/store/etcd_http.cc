// EtcdHttp: Beast's asynchronous operations run on the caller's thread with a deadline
// (io_context::run_until), so every step (resolve, connect, send, receive) is bounded;
// Beast's synchronous calls would wait forever on a member that accepted and then hung.
#include "comm/store/etcd_http.h"

#include <fcntl.h>
#include <poll.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <charconv>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "comm/store/asio_deadline.h"
#include "comm/store/etcd_kv.h"

namespace weft::comm {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
// A reply larger than this is refused rather than buffered (a multi_get of large values
// fits; etcd's own default request limit is 1.5 MiB).
constexpr uint64_t kMaxReplyBytes = uint64_t(256) << 20;
// Pause after each full round of failed members: long enough for an election to finish
// (etcd's default election timeout is 1 s), short enough to notice it soon.
constexpr Millis kFirstBackoff{20}, kMaxBackoff{500};
// gRPC's UNAVAILABLE, which etcd's gateway puts in "code" for "no leader", "request timed
// out", "leader changed".
constexpr int kGrpcUnavailable = 14;
// A reply slower than this makes the call ask the member (on a second connection) whether
// it has named a new leader since the request went out, and again as often while it waits:
// a write that a follower forwarded to a leader that then died is lost in raft without an
// answer, and etcd would answer only after its own timeout (5 s and more).
constexpr Millis kLeaderCheck{100};

enum class Outcome {
  kOk,
  kNotSent,  // nothing reached etcd's state machine: safe to send anywhere
  kUnknown,  // may have been applied: replay only Replay::kSafe requests
  kRefused,  // etcd answered with an error: final
};
struct Attempt {
  Outcome outcome;
  json reply;
  std::string error;
};

std::string string_field(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
}  // namespace

std::string EtcdEndpoint::text() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

EtcdEndpoint parse_etcd_endpoint(const std::string& text, const std::string& field) {
  auto bad = [&](const std::string& why) {
    throw ConfigError(field, "etcd endpoint '" + text + "': " + why);
  };
  std::string s = text;
  if (s.starts_with("https://"))
    bad("TLS is not supported (Weft speaks plain HTTP to etcd's client URL, http://HOST:PORT)");
  if (s.starts_with("http://")) s = s.substr(7);
  if (!s.empty() && s.back() == '/') s.pop_back();
  std::string host, port;
  if (s.starts_with("[")) {
    auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      bad("expected [IPv6]:PORT");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string::npos) bad("expected HOST:PORT (etcd's client port is usually 2379)");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) bad("an IPv6 address goes in brackets: [ADDR]:PORT");
  }
  if (host.empty()) bad("the host is empty");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535)
    bad("the port must be a number in 1..65535");
  return EtcdEndpoint{host, uint16_t(p)};
}

struct EtcdHttp::Impl {
  Impl(std::vector<EtcdEndpoint> e, Millis request, Millis failover)
      : endpoints(std::move(e)), request_timeout(request), failover_timeout(failover) {}

  // run_until_deadline on the request connection; at the deadline the connection is closed.
  template <typename Start>
  beast::error_code run(Start&& start, Clock::time_point deadline) {
    return run_until_deadline(io, start, deadline, [this] {
      resolver.cancel();
      disconnect();
    });
  }

  // As run(), and every kLeaderCheck while the operation waits, `give_up()`: when it says
  // so, the operation is aborted as at its deadline and `gave_up` is set.
  template <typename Start, typename GiveUp>
  beast::error_code run_checking(Start&& start, Clock::time_point deadline, GiveUp&& give_up,
                                 bool* gave_up) {
    std::optional<beast::error_code> result;
    start([&result](beast::error_code ec) { result = ec; });
    io.restart();
    for (;;) {
      io.run_until(std::min(deadline, Clock::now() + kLeaderCheck));
      if (result || Clock::now() >= deadline) break;
      if (give_up()) {
        *gave_up = true;
        break;
      }
      io.restart();
    }
    if (!result) {
      disconnect();
      io.restart();
      io.run();  // the aborted handler runs now, while `result` is still alive
      return asio::error::timed_out;
    }
    return *result;
  }

  // The member's raft term and whether it has a leader, asked on the second connection
  // within `wait` (nullopt: no answer).
  std::optional<std::pair<int64_t, bool>> status(size_t i, Millis wait) {
    const EtcdEndpoint& ep = endpoints[i];
    const auto deadline = Clock::now() + wait;
    auto step = [&](auto start) {
      return run_until_deadline(side_io, start, deadline, [this] {
        side_resolver.cancel();
        close_side();
      });
    };
    beast::error_code ec;
    if (side_connected_to != i) {
      close_side();
      tcp::resolver::results_type addrs;
      ec = step([&](auto done) {
        side_resolver.async_resolve(ep.host, std::to_string(ep.port),
                                    [&addrs, done](beast::error_code ec, auto r) {
                                      addrs = std::move(r);
                                      done(ec);
                                    });
      });
      if (!ec)
        ec = step([&](auto done) {
          side.async_connect(addrs, [done](beast::error_code ec, const auto&) { done(ec); });
        });
      if (ec) return std::nullopt;
      int fd = side.socket().native_handle();
      ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
      side_connected_to = i;
    }
    http::request<http::string_body> req{http::verb::post, "/v3/maintenance/status", 11};
    req.set(http::field::host, ep.text());
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = "{}";
    req.prepare_payload();
    http::response<http::string_body> res;
    ec = step([&](auto done) {
      http::async_write(side, req, [done](beast::error_code ec, size_t) { done(ec); });
    });
    if (!ec)
      ec = step([&](auto done) {
        http::async_read(side, side_buffer, res,
                         [done](beast::error_code ec, size_t) { done(ec); });
      });
    if (ec || res.result() != http::status::ok) {
      close_side();
      return std::nullopt;
    }
    json r = json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("header")) return std::nullopt;
    try {
      // Member ids are uint64 in decimal; "0" or none: no leader.
      const json& leader = r.contains("leader") ? r["leader"] : json();
      const bool has_leader = leader.is_string() && !leader.get<std::string>().empty() &&
                              leader.get<std::string>() != "0";
      return std::pair<int64_t, bool>{etcd::integer(r["header"], "raft_term"), has_leader};
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  void close_side() {
    beast::error_code ignored;
    side.socket().close(ignored);
    side_buffer.clear();
    side_connected_to.reset();
  }

  void disconnect() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
    buffer.clear();
    connected_to.reset();
  }

  // An idle keep-alive connection is readable only when the member closed it (it died or
  // restarted) or broke the protocol: either way it must not carry the next request. This
  // check is what lets a non-replayable request fail over safely after a member's death.
  bool stale() {
    pollfd p{stream.socket().native_handle(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // Connects to member i; returns the error, empty on success.
  std::string connect(size_t i, Clock::time_point deadline) {
    const EtcdEndpoint& ep = endpoints[i];
    tcp::resolver::results_type addrs;
    auto ec = run(
        [&](auto done) {
          resolver.async_resolve(
              ep.host, std::to_string(ep.port),
              [&addrs, done](beast::error_code ec, tcp::resolver::results_type r) {
                addrs = std::move(r);
                done(ec);
              });
        },
        deadline);
    if (ec) return "resolve: " + ec.message();
    ec = run(
        [&](auto done) {
          stream.async_connect(addrs,
                               [done](beast::error_code ec, const tcp::endpoint&) { done(ec); });
        },
        deadline);
    if (ec) {
      disconnect();
      return "connect: " + ec.message();
    }
    stream.socket().set_option(tcp::no_delay(true), ec);
    int fd = stream.socket().native_handle();  // not inherited by processes this one spawns
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
    connected_to = i;
    return {};
  }

  Attempt exchange(size_t i, const std::string& path, const std::string& body,
                   Clock::time_point deadline) {
    if (connected_to && (*connected_to != i || stale())) disconnect();
    if (!connected_to) {
      std::string err = connect(i, deadline);
      if (!err.empty()) return {Outcome::kNotSent, {}, err};
    }
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, endpoints[i].text());
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    auto ec = run(
        [&](auto done) {
          http::async_write(stream, req, [done](beast::error_code ec, size_t) { done(ec); });
        },
        deadline);
    // A request that did not go out whole cannot have been handled (the gateway reads the
    // whole body first).
    if (ec) {
      disconnect();
      return {Outcome::kNotSent, {}, "send: " + ec.message()};
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxReplyBytes);
    // The term the request went out in: the last one this member told us, else the first
    // status check's.
    int64_t sent_in = term[i];
    int64_t named = 0;  // the newer term with a leader that the member named
    auto leader_changed = [&] {
      auto st = status(i, kLeaderCheck);
      if (!st) return false;
      if (sent_in == 0) sent_in = st->first;
      if (st->second && st->first > sent_in) named = st->first;
      return named != 0;
    };
    bool gave_up = false;
    ec = run_checking(
        [&](auto done) {
          http::async_read(stream, buffer, parser,
                           [done](beast::error_code ec, size_t) { done(ec); });
        },
        deadline, leader_changed, &gave_up);
    close_side();  // opened for a late reply only, which is rare: not kept
    if (gave_up) {
      term[i] = named;
      return {Outcome::kUnknown,
              {},
              "no reply, and the member named a new leader (raft term " + std::to_string(named) +
                  ") while the request was in flight"};
    }
    if (ec) {
      disconnect();
      return {Outcome::kUnknown, {}, "no reply: " + ec.message()};
    }
    const auto& res = parser.get();
    if (!res.keep_alive()) disconnect();
    json reply = json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
    const std::string status = "HTTP " + std::to_string(res.result_int());
    if (reply.is_discarded() || !reply.is_object())
      return {Outcome::kRefused,
              {},
              status + " with a reply that is not etcd's JSON (is this etcd's client port?)"};
    if (auto h = reply.find("header"); h != reply.end() && h->is_object()) try {
        term[i] = std::max(term[i], etcd::integer(*h, "raft_term"));
      } catch (const std::exception&) {
      }
    if (res.result() == http::status::ok) return {Outcome::kOk, std::move(reply), {}};
    std::string msg = string_field(reply, "message");
    if (msg.empty()) msg = string_field(reply, "error");
    if (msg.empty()) msg = status;
    auto code = reply.find("code");
    int c = code != reply.end() && code->is_number_integer() ? code->get<int>() : -1;
    // "no leader" is refused before anything is proposed; the other UNAVAILABLE answers
    // ("request timed out", "leader changed") may have been applied all the same.
    if (c == kGrpcUnavailable)
      return {msg.find("no leader") != std::string::npos ? Outcome::kNotSent : Outcome::kUnknown,
              {},
              msg};
    return {Outcome::kRefused, {}, msg + " (code " + std::to_string(c) + ")"};
  }

  const std::vector<EtcdEndpoint> endpoints;
  const Millis request_timeout, failover_timeout;
  std::mutex mu;                   // held by post() for the whole call
  std::atomic<size_t> current{0};  // the member tried first; written under mu
  asio::io_context io;             // the members below are used under mu only
  tcp::resolver resolver{io};
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;
  std::optional<size_t> connected_to;  // the member `stream` is connected to
  // The latest raft term each member's replies carried (0: none yet).
  std::vector<int64_t> term = std::vector<int64_t>(endpoints.size(), 0);
  // The second connection, for status checks while a request waits (status()).
  asio::io_context side_io;
  tcp::resolver side_resolver{side_io};
  beast::tcp_stream side{side_io};
  beast::flat_buffer side_buffer;
  std::optional<size_t> side_connected_to;
};

EtcdHttp::EtcdHttp(std::vector<EtcdEndpoint> endpoints, Millis request_timeout,
                   Millis failover_timeout) {
  if (endpoints.empty()) throw InternalError("EtcdHttp: no endpoints");
  impl_ = std::make_unique<Impl>(std::move(endpoints), request_timeout, failover_timeout);
}

EtcdHttp::~EtcdHttp() {
  impl_->disconnect();
  impl_->close_side();
}

std::string EtcdHttp::endpoint() const { return impl_->endpoints[impl_->current].text(); }

json EtcdHttp::post(const std::string& path, const json& body, Replay replay) {
  const std::string text = body.dump();
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  const size_t n = m.endpoints.size();
  const auto give_up = Clock::now() + m.failover_timeout;
  std::vector<std::string> last(n);
  Millis backoff = kFirstBackoff;
  for (size_t tries = 1;; ++tries) {
    const size_t i = m.current;
    const auto sent = Clock::now();
    Attempt a = m.exchange(i, path, text, sent + m.request_timeout);
    const std::string where = "etcd at " + m.endpoints[i].text() + ": " + path + ": ";
    const double took = std::chrono::duration<double>(Clock::now() - sent).count();
    if (a.outcome != Outcome::kOk || took >= 0.05)
      WEFT_DEBUG("etcd", where, a.outcome == Outcome::kOk ? "answered" : "failed", " after ", took,
                 " s", a.error.empty() ? "" : ": " + a.error);
    if (a.outcome == Outcome::kOk) return std::move(a.reply);
    if (a.outcome == Outcome::kRefused) throw CommError(where + a.error);
    if (a.outcome == Outcome::kUnknown && replay == Replay::kUnsafe)
      throw CommError(where + a.error +
                      "; the request may or may not have been applied, and it is not sent "
                      "again because applying it twice would be wrong");
    last[i] = a.error;
    m.current = (i + 1) % n;
    const auto now = Clock::now();
    if (tries >= n && now >= give_up) {
      std::string msg = "etcd: no member answered " + path + " within " +
                        std::to_string(m.failover_timeout.count()) + " ms:";
      for (size_t k = 0; k < n; ++k)
        msg += (k ? "; " : " ") + m.endpoints[k].text() + " (" + last[k] + ")";
      throw CommError(msg);
    }
    if (tries % n == 0) {
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, give_up - now));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
}

}  // namespace weft::comm
