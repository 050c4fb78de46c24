// TCPStoreServer: an Asio accept loop, one Session per connection, waits parked as timers.
// Everything runs on the server's single thread, so the table and the wait index need no
// locks; only the stats counters are read from other threads.
#include "comm/store/tcp_store_server.h"

// Individual Asio headers: the umbrella pulls in awaitable.hpp, which in Boost 1.74 lacks
// <utility> and fails under GCC 12's C++20 headers.
#include <array>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <future>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/log.h"
#include "comm/store/kv_table.h"
#include "comm/store/protocol.h"
#include "comm/store/store_util.h"

namespace weft::comm {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using wire::Op;
using wire::Status;

namespace {
// What a parked wait costs beyond its keys (timer, bookkeeping): charged to the client.
constexpr size_t kWaiterOverhead = 256;
// Larger read buffers are released after each frame so idle clients hold little memory.
constexpr size_t kKeepBodyCapacity = 64 << 10;
constexpr int kWarnBurst = 20;
}  // namespace

class Session;

// A get / multi_get / wait whose keys were missing: parked until they all exist or its
// timer fires, whichever comes first; `done` makes the loser a no-op.
struct Waiter {
  Waiter(asio::io_context& io, std::weak_ptr<Session> s) : session(std::move(s)), timer(io) {}
  std::weak_ptr<Session> session;
  uint64_t request = 0;
  Op op = Op::kWait;
  std::vector<std::string> keys;
  Millis timeout{0};
  size_t bytes = 0;
  bool done = false;
  asio::steady_timer timer;
};

class TCPStoreServer::Impl {
 public:
  explicit Impl(TCPStoreServerOptions o);
  void stop();

  // Called by sessions, on the server thread.
  void handle(const std::shared_ptr<Session>& s, uint64_t req, Op op, wire::Reader& r);
  void forget(Session* s);
  // WEFT_WARN, at most kWarnBurst lines a second: a flood of bad clients must not flood the
  // log too. The next line that gets through says how many were held back.
  void warn(const std::string& line);
  void finish_waiter(const std::shared_ptr<Waiter>& w, bool timed_out);

  TCPStoreServerOptions opts;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  asio::steady_timer expiry{io};
  std::optional<KvTable::Clock::time_point> expiry_armed;
  KvTable table;
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiting;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stopped{false};
  KvTable::Clock::time_point warn_window{};
  int warn_count = 0;
  uint64_t warn_suppressed = 0;
  std::atomic<uint64_t> accepted{0}, open{0}, malformed{0}, over_limit{0}, requests{0}, parked{0};

 private:
  void accept();
  void arm_expiry();
  void notify(const std::string& key);
  void park(const std::shared_ptr<Session>& s, uint64_t req, Op op, std::vector<std::string> keys,
            int64_t timeout_ms);
  void unindex(const std::shared_ptr<Waiter>& w);
};

// One client connection: reads frames, hands them to the server, queues replies.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TCPStoreServer::Impl& srv, tcp::socket sock) : srv_(srv), sock_(std::move(sock)) {
    boost::system::error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    sock_.set_option(tcp::no_delay(true), ec);
  }

  void start() { read_header(); }
  const std::string& peer() const { return peer_; }
  bool closed() const { return closed_; }

  void reply(uint64_t req, Status status, wire::Writer&& w) {
    if (closed_) return;
    Bytes frame = w.finish();
    out_bytes_ += frame.size();
    out_.push_back(std::move(frame));
    if (usage() > srv_.opts.max_client_bytes) {
      drop_over_limit("replies it does not read");
      return;
    }
    if (!writing_) write_next();
  }
  static wire::Writer header(uint64_t req, Status status) {
    wire::Writer w;
    w.u64(req).u8(static_cast<uint8_t>(status));
    return w;
  }
  void reply_error(uint64_t req, Status status, const std::string& msg) {
    auto w = header(req, status);
    w.str(msg);
    reply(req, status, std::move(w));
  }

  // Charges a parked wait to this client; false (and the connection dropped) past the bound.
  bool charge_waiter(const std::shared_ptr<Waiter>& w) {
    waiters_.insert(w);
    waiter_bytes_ += w->bytes;
    if (usage() > srv_.opts.max_client_bytes) {
      drop_over_limit("parked waits");
      return false;
    }
    return true;
  }
  void release_waiter(const std::shared_ptr<Waiter>& w) {
    if (waiters_.erase(w)) waiter_bytes_ -= w->bytes;
  }

  // Closes only this connection. `reason` empty: the client left (debug log only).
  void close(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (!reason.empty()) {
      srv_.warn(str("closing connection from ", peer_, ": ", reason));
    } else {
      WEFT_DEBUG("store", "client ", peer_, " disconnected");
    }
    boost::system::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    auto parked = std::move(waiters_);
    waiters_.clear();
    waiter_bytes_ = 0;
    for (const auto& w : parked) srv_.finish_waiter(w, /*timed_out=*/false);
    // out_ stays: an aborted async_write may still name its front buffer until it unwinds.
    srv_.forget(this);
  }

 private:
  size_t usage() const { return body_.size() + out_bytes_ + waiter_bytes_; }

  void drop_malformed(const std::string& why) {
    ++srv_.malformed;
    close("malformed frame: " + why);
  }
  void drop_over_limit(const std::string& what) {
    ++srv_.over_limit;
    close("over max_client_bytes (" + std::to_string(srv_.opts.max_client_bytes) + ") with " +
          std::to_string(usage()) + " bytes held, mostly " + what);
  }

  void read_header() {
    asio::async_read(sock_, asio::buffer(len_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->close("");
                       self->on_header();
                     });
  }

  void on_header() {
    uint32_t len = wire::decode_length(len_.data());
    if (len < wire::kMinBody)
      return drop_malformed("body length " + std::to_string(len) + " below the minimum");
    if (len > srv_.opts.max_client_bytes)
      return drop_malformed("body length " + std::to_string(len) + " exceeds max_client_bytes " +
                            std::to_string(srv_.opts.max_client_bytes));
    body_.resize(len);
    if (usage() > srv_.opts.max_client_bytes) return drop_over_limit("an incoming frame");
    asio::async_read(sock_, asio::buffer(body_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->close("");
                       self->on_body();
                     });
  }

  void on_body() {
    auto self = shared_from_this();
    try {
      wire::Reader r(body_.data(), body_.size());
      uint64_t req = r.u64();
      uint8_t op = r.u8();
      if (op < 1 || op > wire::kMaxOp)
        return drop_malformed("unknown op code " + std::to_string(op));
      try {
        srv_.handle(self, req, static_cast<Op>(op), r);
      } catch (const wire::ProtocolError&) {
        throw;
      } catch (const CommError& e) {
        // The store refused a well-formed request (value too long, add on text): the
        // client gets the reason, the connection stays.
        reply_error(req, Status::kError, e.what());
      }
    } catch (const wire::ProtocolError& e) {
      return drop_malformed(e.what());
    } catch (const std::exception& e) {
      // bad_alloc and the like: lose this connection, never the server.
      return close(std::string("internal error: ") + e.what());
    }
    if (closed_) return;
    body_.clear();
    if (body_.capacity() > kKeepBodyCapacity) body_.shrink_to_fit();
    read_header();
  }

  void write_next() {
    writing_ = true;
    asio::async_write(sock_, asio::buffer(out_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (ec || self->closed_) return self->close("");
                        self->out_bytes_ -= self->out_.front().size();
                        self->out_.pop_front();
                        self->writing_ = false;
                        if (!self->out_.empty()) self->write_next();
                      });
  }

  TCPStoreServer::Impl& srv_;
  tcp::socket sock_;
  std::string peer_;
  std::array<uint8_t, wire::kLengthBytes> len_{};
  Bytes body_;
  std::deque<Bytes> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  std::unordered_set<std::shared_ptr<Waiter>> waiters_;
  size_t waiter_bytes_ = 0;
  bool closed_ = false;
};

TCPStoreServer::Impl::Impl(TCPStoreServerOptions o)
    : opts(std::move(o)), table(opts.max_value_bytes) {
  try {
    tcp::resolver resolver(io);
    auto endpoints = resolver.resolve(opts.host, std::to_string(opts.port), tcp::resolver::passive);
    tcp::endpoint ep = *endpoints.begin();
    acceptor.open(ep.protocol());
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(asio::socket_base::max_listen_connections);
    port = acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw CommError("store: cannot listen on " + opts.host + ":" + std::to_string(opts.port) +
                    ": " + e.what());
  }
  accept();
  thread = std::thread([this] {
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw past its session's guard; log and keep serving the others.
        warn(std::string("server handler failed: ") + e.what());
      }
    }
  });
}

void TCPStoreServer::Impl::accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors and the like: back off instead of spinning.
      warn("accept failed: " + ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](boost::system::error_code e) {
        if (!e) accept();
      });
      return;
    }
    auto s = std::make_shared<Session>(*this, std::move(sock));
    sessions[s.get()] = s;
    ++accepted;
    ++open;
    s->start();
    accept();
  });
}

void TCPStoreServer::Impl::forget(Session* s) {
  if (sessions.erase(s)) --open;
}

void TCPStoreServer::Impl::warn(const std::string& line) {
  auto now = KvTable::Clock::now();
  if (now - warn_window >= std::chrono::seconds(1)) {
    warn_window = now;
    warn_count = 0;
  }
  if (++warn_count > kWarnBurst) {
    ++warn_suppressed;
    return;
  }
  if (warn_suppressed) {
    WEFT_WARN("store", line, " (", warn_suppressed, " similar warnings suppressed)");
    warn_suppressed = 0;
  } else {
    WEFT_WARN("store", line);
  }
}

void TCPStoreServer::Impl::stop() {
  if (stopped.exchange(true)) return;
  std::promise<void> done;
  asio::post(io, [this, &done] {
    boost::system::error_code ec;
    acceptor.close(ec);
    accept_retry.cancel();
    expiry.cancel();
    auto all = sessions;
    for (auto& [p, s] : all) s->close("");
    done.set_value();
  });
  // Bounded: if the thread already died the post never runs, so do not wait forever.
  done.get_future().wait_for(std::chrono::seconds(10));
  io.stop();
  if (thread.joinable()) thread.join();
}

void TCPStoreServer::Impl::arm_expiry() {
  auto next = table.expire();
  if (!next || (expiry_armed && *expiry_armed <= *next)) return;
  expiry_armed = next;
  expiry.expires_at(*next);
  expiry.async_wait([this](boost::system::error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    expiry_armed.reset();
    arm_expiry();
  });
}

void TCPStoreServer::Impl::notify(const std::string& key) {
  auto it = waiting.find(key);
  if (it == waiting.end()) return;
  auto candidates = it->second;  // finish_waiter edits the index
  for (const auto& w : candidates)
    if (!w->done && table.contains_all(w->keys)) finish_waiter(w, false);
}

void TCPStoreServer::Impl::unindex(const std::shared_ptr<Waiter>& w) {
  for (const auto& k : w->keys) {
    auto it = waiting.find(k);
    if (it == waiting.end()) continue;
    std::erase(it->second, w);
    if (it->second.empty()) waiting.erase(it);
  }
}

void TCPStoreServer::Impl::park(const std::shared_ptr<Session>& s, uint64_t req, Op op,
                                std::vector<std::string> keys, int64_t timeout_ms) {
  auto w = std::make_shared<Waiter>(io, s);
  w->request = req;
  w->op = op;
  w->timeout = clamp_timeout(Millis(timeout_ms));
  w->keys = std::move(keys);
  w->bytes = kWaiterOverhead;
  for (const auto& k : w->keys) w->bytes += k.size() + sizeof(std::string);
  ++parked;  // before charging: a refused charge closes the session, which finishes w
  if (!s->charge_waiter(w)) return;
  for (const auto& k : w->keys) waiting[k].push_back(w);
  w->timer.expires_after(w->timeout);
  w->timer.async_wait([this, w](boost::system::error_code ec) {
    if (ec != asio::error::operation_aborted && !w->done) finish_waiter(w, true);
  });
}

void TCPStoreServer::Impl::finish_waiter(const std::shared_ptr<Waiter>& w, bool timed_out) {
  if (w->done) return;
  w->done = true;
  --parked;
  w->timer.cancel();
  unindex(w);
  auto s = w->session.lock();
  if (!s || s->closed()) return;
  s->release_waiter(w);
  if (timed_out)
    return s->reply_error(w->request, Status::kTimeout, timeout_message(w->keys, w->timeout));
  auto out = Session::header(w->request, Status::kOk);
  if (w->op == Op::kGet) out.bytes(*table.find(w->keys[0]));
  if (w->op == Op::kMultiGet) {
    out.u32(static_cast<uint32_t>(w->keys.size()));
    for (const auto& k : w->keys) out.bytes(*table.find(k));
  }
  s->reply(w->request, Status::kOk, std::move(out));
}

void TCPStoreServer::Impl::handle(const std::shared_ptr<Session>& s, uint64_t req, Op op,
                                  wire::Reader& r) {
  auto ok = Session::header(req, Status::kOk);
  switch (op) {
    case Op::kPing:
      r.expect_end();
      break;
    case Op::kSet: {
      std::string key = r.str();
      Bytes value = r.bytes();
      int64_t ttl = r.i64();
      r.expect_end();
      table.set(key, std::move(value), ttl > 0 ? std::optional<Millis>(Millis(ttl)) : std::nullopt);
      notify(key);
      break;
    }
    case Op::kGet:
    case Op::kWait:
    case Op::kMultiGet: {
      std::vector<std::string> keys;
      if (op == Op::kGet)
        keys.push_back(r.str());
      else
        keys = r.strings();
      int64_t timeout_ms = r.i64();
      r.expect_end();
      ++requests;
      if (!table.contains_all(keys)) {
        if (timeout_ms <= 0)
          return s->reply_error(req, Status::kTimeout, timeout_message(keys, Millis(0)));
        return park(s, req, op, std::move(keys), timeout_ms);
      }
      if (op == Op::kGet) ok.bytes(*table.find(keys[0]));
      if (op == Op::kMultiGet) {
        ok.u32(static_cast<uint32_t>(keys.size()));
        for (const auto& k : keys) ok.bytes(*table.find(k));
      }
      return s->reply(req, Status::kOk, std::move(ok));
    }
    case Op::kAdd: {
      std::string key = r.str();
      int64_t delta = r.i64();
      r.expect_end();
      ok.i64(table.add(key, delta));
      notify(key);
      break;
    }
    case Op::kCompareSet: {
      std::string key = r.str();
      Bytes expected = r.bytes();
      Bytes desired = r.bytes();
      r.expect_end();
      bool wrote = false;
      ok.bytes(table.compare_set(key, expected, std::move(desired), &wrote));
      if (wrote) notify(key);
      break;
    }
    case Op::kCheck: {
      auto keys = r.strings();
      r.expect_end();
      ok.u8(table.contains_all(keys) ? 1 : 0);
      break;
    }
    case Op::kErase: {
      std::string key = r.str();
      r.expect_end();
      ok.u8(table.erase(key) ? 1 : 0);
      break;
    }
    case Op::kNumKeys: {
      std::string prefix = r.str();
      r.expect_end();
      ok.i64(table.count(prefix));
      break;
    }
    case Op::kAppend: {
      std::string key = r.str();
      Bytes value = r.bytes();
      r.expect_end();
      table.append(key, value);
      notify(key);
      break;
    }
    case Op::kMultiSet: {
      uint32_t n = r.u32();
      if (n > r.remaining() / 8)
        throw wire::ProtocolError("multi_set count " + std::to_string(n) + " exceeds frame");
      std::vector<std::string> keys;
      std::vector<Bytes> values;
      for (uint32_t i = 0; i < n; ++i) {
        keys.push_back(r.str());
        values.push_back(r.bytes());
      }
      r.expect_end();
      table.multi_set(keys, values);
      for (const auto& k : keys) notify(k);
      break;
    }
  }
  ++requests;
  arm_expiry();
  s->reply(req, Status::kOk, std::move(ok));
}

TCPStoreServer::TCPStoreServer(TCPStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TCPStoreServer::~TCPStoreServer() {
  try {
    stop();
  } catch (...) {
  }
}

uint16_t TCPStoreServer::port() const { return impl_->port; }
const std::string& TCPStoreServer::host() const { return impl_->opts.host; }
void TCPStoreServer::stop() { impl_->stop(); }

TCPStoreServerStats TCPStoreServer::stats() const {
  TCPStoreServerStats s;
  s.connections_accepted = impl_->accepted;
  s.connections_open = impl_->open;
  s.dropped_malformed = impl_->malformed;
  s.dropped_over_limit = impl_->over_limit;
  s.requests = impl_->requests;
  s.waits_parked = impl_->parked;
  return s;
}

}  // namespace weft::comm
