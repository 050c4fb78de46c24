// EtcdWatch: Beast's asynchronous operations run on the caller's thread until a deadline
// (as in etcd_http.cc) or another thread's stop. A wait that reaches its deadline cancels only
// the pending read, so the stream, and the watch at the member, live on for the next call.
#include "comm/store/etcd_watch.h"

#include <fcntl.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <utility>

#include "base/error.h"
#include "comm/store/asio_deadline.h"
#include "comm/store/etcd_kv.h"

namespace weft::comm {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;

namespace {
// One message of the stream larger than this is a broken stream, not a watch reply (a
// message carries the events of one revision; values are at most etcd's request limit).
constexpr size_t kMaxMessageBytes = size_t(64) << 20;
}  // namespace

struct EtcdWatch::Impl {
  Impl(EtcdEndpoint m, std::stop_token s) : member(std::move(m)), stop(std::move(s)) {
    // Another thread reaches the io only through post(). A stop that comes between two
    // operations cancels nothing; run() looks at `stop` before it starts the next one.
    on_stop.emplace(stop, [this] { asio::post(io, [this] { cancel(); }); });
  }

  // Ends the pending operation (its handler gets operation_aborted).
  void cancel() {
    resolver.cancel();
    beast::error_code ignored;
    stream.socket().cancel(ignored);
  }

  // run_until_deadline on the stream; at the deadline only the pending operation is
  // cancelled: the socket, and the watch at the member, stay for the next call. A stop
  // ends it too (operation_aborted), or keeps it from starting.
  template <typename Start>
  beast::error_code run(Start&& start, Clock::time_point deadline) {
    if (stop.stop_requested()) return asio::error::operation_aborted;
    return run_until_deadline(io, start, deadline, [this] { cancel(); });
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw CommError("etcd watch at " + member.text() + ": " + what +
                    (stop.stop_requested() ? " (stopped)" : ""));
  }

  // Splits what the chunks carried so far into messages (one JSON object per line) and
  // returns the keys of the events among them; throws for an error or a cancelled watch.
  std::vector<std::string> take_messages(bool* created) {
    std::vector<std::string> keys;
    size_t eol;
    while ((eol = pending.find('\n')) != std::string::npos) {
      json m = json::parse(pending.substr(0, eol), nullptr, /*allow_exceptions=*/false);
      pending.erase(0, eol + 1);
      if (m.is_discarded() || !m.is_object()) fail("a message that is not JSON");
      if (auto e = m.find("error"); e != m.end()) {
        const json& err = *e;
        fail("the member ended the watch: " +
             (err.is_object() && err.contains("message") ? err["message"].dump() : err.dump()));
      }
      auto r = m.find("result");
      if (r == m.end() || !r->is_object()) fail("a message without a result: " + m.dump());
      if (r->value("created", false)) *created = true;
      if (r->value("canceled", false))
        fail("the member cancelled the watch (" + r->value("cancel_reason", std::string()) +
             (etcd::integer(*r, "compact_revision") ? ", revisions compacted" : "") + ")");
      if (auto ev = r->find("events"); ev != r->end() && ev->is_array())
        for (const auto& e : *ev)
          if (auto kv = e.find("kv"); kv != e.end() && kv->contains("key")) {
            Bytes k = etcd::unbase64((*kv)["key"].get<std::string>());
            keys.emplace_back(k.begin(), k.end());
          }
    }
    if (pending.size() > kMaxMessageBytes) fail("a message over 64 MiB");
    return keys;
  }

  // Reads what arrives until a message with events (or, before `created`, the creation)
  // or `deadline`.
  std::vector<std::string> read(Clock::time_point deadline, bool* created) {
    for (;;) {
      auto keys = take_messages(created);
      if (!keys.empty() || (created && *created)) return keys;
      if (parser.is_done()) fail("the stream ended");
      auto ec = run(
          [&](auto done) {
            http::async_read_some(stream, buffer, parser,
                                  [done](beast::error_code ec, size_t) { done(ec); });
          },
          deadline);
      if (ec == asio::error::timed_out || stop.stop_requested()) return {};
      if (ec) fail("the stream broke: " + ec.message());
    }
  }

  const EtcdEndpoint member;
  asio::io_context io;
  tcp::resolver resolver{io};
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  std::string pending;  // stream bytes not yet split into messages
  // The parser keeps a reference to its chunk callback: it lives here.
  std::function<std::size_t(std::uint64_t, beast::string_view, beast::error_code&)> to_pending =
      [this](std::uint64_t, beast::string_view body, beast::error_code&) {
        pending.append(body.data(), body.size());
        return body.size();
      };
  // Events that came with the creation, for the first next().
  std::vector<std::string> early;
  const std::stop_token stop;
  // Last: gone before the io it posts to.
  std::optional<std::stop_callback<std::function<void()>>> on_stop;
};

EtcdWatch::EtcdWatch(const EtcdEndpoint& member, const std::string& key,
                     const std::string& range_end, int64_t start_revision,
                     Clock::time_point deadline, Events events, std::stop_token stop)
    : impl_(std::make_unique<Impl>(member, std::move(stop))) {
  Impl& m = *impl_;
  tcp::resolver::results_type addrs;
  auto ec = m.run(
      [&](auto done) {
        m.resolver.async_resolve(member.host, std::to_string(member.port),
                                 [&addrs, done](beast::error_code ec, auto r) {
                                   addrs = std::move(r);
                                   done(ec);
                                 });
      },
      deadline);
  if (ec) m.fail("resolve: " + ec.message());
  ec = m.run(
      [&](auto done) {
        m.stream.async_connect(addrs, [done](beast::error_code ec, const auto&) { done(ec); });
      },
      deadline);
  if (ec) m.fail("connect: " + ec.message());
  m.stream.socket().set_option(tcp::no_delay(true), ec);
  const int fd = m.stream.socket().native_handle();  // not inherited by spawned processes
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);

  json create = {{"key", etcd::base64(key)}, {"start_revision", std::to_string(start_revision)}};
  if (!range_end.empty()) create["range_end"] = etcd::base64(range_end);
  if (events == Events::kDeletes) create["filters"] = json::array({"NOPUT"});
  http::request<http::string_body> req{http::verb::post, "/v3/watch", 11};
  req.set(http::field::host, member.text());
  req.set(http::field::content_type, "application/json");
  // etcd's WithRequireLeader, as gRPC metadata through the gateway.
  req.set("Grpc-Metadata-hasleader", "true");
  req.body() = json{{"create_request", create}}.dump();
  req.prepare_payload();
  ec = m.run(
      [&](auto done) {
        http::async_write(m.stream, req, [done](beast::error_code ec, size_t) { done(ec); });
      },
      deadline);
  if (ec) m.fail("send: " + ec.message());

  // The stream has no end. Not boost::none: Boost 1.74's parser then compares a
  // Content-Length with the empty optional and refuses every sized reply (a 404's body) as
  // "body limit exceeded", which hid a member without /v3/watch behind a broken-stream error.
  m.parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  ec = m.run(
      [&](auto done) {
        http::async_read_header(m.stream, m.buffer, m.parser,
                                [done](beast::error_code ec, size_t) { done(ec); });
      },
      deadline);
  if (ec) m.fail("no reply: " + ec.message());
  const auto& res = m.parser.get();
  if (res.result() != http::status::ok || !m.parser.chunked())
    throw EtcdWatchUnsupported("etcd watch at " + member.text() + ": HTTP " +
                               std::to_string(res.result_int()) +
                               (m.parser.chunked() ? "" : " without a stream") +
                               " (an etcd without the v3 gateway's /v3/watch?)");
  // From here on the chunks go to `pending`, not to the body.
  m.parser.on_chunk_body(m.to_pending);
  bool created = false;
  m.early = m.read(deadline, &created);
  if (!created) m.fail("no 'created' within the request timeout");
}

EtcdWatch::~EtcdWatch() {
  beast::error_code ignored;
  impl_->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  impl_->stream.socket().close(ignored);
}

std::vector<std::string> EtcdWatch::next(Clock::time_point deadline) {
  if (!impl_->early.empty()) return std::exchange(impl_->early, {});
  return impl_->read(deadline, nullptr);
}

const EtcdEndpoint& EtcdWatch::member() const { return impl_->member; }

}  // namespace weft::comm
