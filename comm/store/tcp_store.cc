// TCPStore: frames go out through an Asio write queue; one read loop hands each reply to
// the promise registered under its request id, so waits on one connection overlap.
#include "comm/store/tcp_store.h"

// Individual Asio headers: the umbrella pulls in awaitable.hpp, which in Boost 1.74 lacks
// <utility> and fails under GCC 12's C++20 headers.
#include <fcntl.h>

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
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <unordered_map>

#include "base/error.h"
#include "comm/store/auth.h"
#include "comm/store/client_process.h"
#include "comm/store/protocol.h"
#include "comm/store/store_util.h"

namespace weft::comm {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using wire::Op;
using wire::Status;

namespace {
// How long past a wait's own timeout the client still expects the server's answer.
constexpr Millis kReplyGrace{3'000};
// Replies larger than this are treated as a corrupt stream, not allocated.
constexpr uint32_t kMaxReplyBody = uint32_t(1) << 31;

struct Reply {
  Status status = Status::kOk;
  Bytes body;  // whole reply body; the payload starts after id and status
  wire::Reader payload() const {
    return wire::Reader(body.data() + wire::kMinBody, body.size() - wire::kMinBody);
  }
};
}  // namespace

class TCPStore::Connection {
 public:
  Connection(const TCPStoreOptions& o) : where_(o.host + ":" + std::to_string(o.port)) {
    auto deadline = std::chrono::steady_clock::now() + o.timeout;
    connect(o, deadline);
    handshake(o, deadline);
    read_header();
    thread_ = std::thread([this] { io_.run(); });
  }

  // The server offers keys bound to the connection (its hello had kHelloBindsKeys).
  bool binds() const { return binds_; }
  // The server takes kOwner (its hello had kHelloWatchesOwners).
  bool watches_owners() const { return watches_owners_; }
  // The server takes kWaitGone (its hello had kHelloWaitsGone).
  bool waits_gone() const { return waits_gone_; }

  ~Connection() {
    asio::post(io_, [this] {
      closing_ = true;
      boost::system::error_code ec;
      sock_.shutdown(tcp::socket::shutdown_both, ec);
      sock_.close(ec);
    });
    thread_.join();  // returns once the aborted read and writes have unwound
    fail_all("store client closed");
  }

  // Sends one request and waits up to `within` for its reply; throws per the Store contract.
  Reply call(Op op, const std::function<void(wire::Writer&)>& args, Millis within) {
    return *call(op, args, within, std::stop_token());
  }

  // call() that another thread can end: nullopt as soon as `stop` is requested (at once, with
  // nothing sent, when it already is). The request is then given up as one whose reply is
  // overdue: the reply that the server still sends finds no promise and is dropped.
  std::optional<Reply> call(Op op, const std::function<void(wire::Writer&)>& args, Millis within,
                            const std::stop_token& stop) {
    if (stop.stop_requested()) return std::nullopt;
    uint64_t id = next_id_++;
    wire::Writer w;
    w.u64(id).u8(static_cast<uint8_t>(op));
    args(w);  // may throw (a blob over 4 GiB) before anything is registered
    auto frame = std::make_shared<Bytes>(w.finish());
    std::future<Reply> reply;
    {
      std::lock_guard lock(mu_);
      if (!broken_.empty()) throw CommError("store " + where_ + ": " + broken_);
      reply = pending_[id].get_future();
    }
    asio::post(io_, [this, frame] {
      out_.push_back(std::move(*frame));
      if (out_.size() == 1) write_next();
    });
    std::stop_callback give_up(stop, [this, id] { abandon(id); });
    if (reply.wait_for(clamp_timeout(within)) != std::future_status::ready) {
      std::lock_guard lock(mu_);
      pending_.erase(id);  // a late reply finds no promise and is dropped
      throw TimeoutError("store " + where_ + ": no reply to " + wire::op_name(op) + " within " +
                         std::to_string(within.count()) + " ms");
    }
    if (stop.stop_requested()) return std::nullopt;  // abandon() may have answered it
    Reply r = reply.get();  // rethrows CommError when the connection broke
    if (r.status == Status::kOk) return r;
    std::string msg;
    try {
      msg = r.payload().str();
    } catch (const wire::ProtocolError&) {
      msg = "(unreadable error message)";
    }
    if (r.status == Status::kTimeout) throw TimeoutError(msg);
    throw CommError(msg);
  }

 private:
  void connect(const TCPStoreOptions& o, std::chrono::steady_clock::time_point deadline) {
    Millis backoff{20};
    std::string last;
    for (;;) {
      boost::system::error_code ec;
      tcp::resolver resolver(io_);
      auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
      if (ec) throw CommError("store " + where_ + ": cannot resolve host: " + ec.message());
      asio::connect(sock_, endpoints, ec);
      if (!ec) {
        sock_.set_option(tcp::no_delay(true), ec);
        int fd = sock_.native_handle();  // not inherited by processes this one spawns
        ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
        return;
      }
      last = ec.message();
      // The server may not be listening yet; retry until the deadline.
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw TimeoutError("store " + where_ + ": cannot connect within " +
                           std::to_string(o.timeout.count()) + " ms: " + last);
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, Millis(1'000));
    }
  }

  // Hello (nonce) in, proof out, verdict in; run on io_ before its thread starts, bounded
  // by the connect deadline. The token stays here: only the HMAC of the nonce is sent.
  void handshake(const TCPStoreOptions& o, std::chrono::steady_clock::time_point deadline) {
    std::string failure;
    bool done = false;
    Bytes frame;
    auto read_frame = [&](size_t max, std::function<void(wire::Reader&)> then) {
      asio::async_read(
          sock_, asio::buffer(len_), [&, max, then](boost::system::error_code ec, size_t) {
            if (ec)
              return void(failure = "connection closed during the handshake: " + ec.message());
            uint32_t len = wire::decode_length(len_.data());
            if (len < 1 || len > max) return void(failure = "not a weft store (bad handshake)");
            frame.resize(len);
            asio::async_read(
                sock_, asio::buffer(frame), [&, then](boost::system::error_code ec, size_t) {
                  if (ec)
                    return void(failure =
                                    "connection closed during the handshake: " + ec.message());
                  try {
                    wire::Reader r(frame.data(), frame.size());
                    then(r);
                  } catch (const wire::ProtocolError&) {
                    failure = "not a weft store (bad handshake)";
                  }
                });
          });
    };
    Bytes out;
    read_frame(wire::kMaxHandshakeBody, [&](wire::Reader& hello) {
      uint8_t version = hello.u8();
      uint8_t flags = hello.u8();
      Bytes nonce = hello.bytes();
      hello.expect_end();
      if (version != wire::kHandshakeVersion)
        return void(failure = "handshake version " + std::to_string(version) + " unsupported");
      binds_ = (flags & wire::kHelloBindsKeys) != 0;
      watches_owners_ = (flags & wire::kHelloWatchesOwners) != 0;
      waits_gone_ = (flags & wire::kHelloWaitsGone) != 0;
      if ((flags & wire::kHelloTokenRequired) && o.token.empty())
        return void(failure =
                        "the store requires the job token and this client has none: set "
                        "WEFT_JOB_TOKEN (or WEFT_JOB_TOKEN_FILE) to the job's token");
      wire::Writer w;
      w.u8(wire::kHandshakeVersion).bytes(o.token.empty() ? Bytes() : auth::proof(o.token, nonce));
      out = w.finish();
      asio::async_write(sock_, asio::buffer(out), [&](boost::system::error_code ec, size_t) {
        if (ec) return void(failure = "connection closed during the handshake: " + ec.message());
        read_frame(wire::kMaxHandshakeBody, [&](wire::Reader& verdict) {
          uint8_t status = verdict.u8();
          if (status == static_cast<uint8_t>(Status::kOk)) {
            verdict.expect_end();
            done = true;
            return;
          }
          failure = verdict.str() + " (the token was refused: WEFT_JOB_TOKEN must hold the " +
                    "job's token, the same as the store's)";
        });
      });
    });
    auto left = deadline - std::chrono::steady_clock::now();
    io_.run_for(std::max<std::chrono::steady_clock::duration>(left, Millis(1000)));
    if (!done) {
      boost::system::error_code ec;
      sock_.close(ec);
      io_.restart();
      io_.run();  // let the aborted operations unwind before their captures go
      if (failure.empty())
        throw TimeoutError("store " + where_ + ": no handshake from the store within " +
                           std::to_string(o.timeout.count()) + " ms");
      throw CommError("store " + where_ + ": " + failure);
    }
    io_.restart();
  }

  void read_header() {
    asio::async_read(sock_, asio::buffer(len_), [this](boost::system::error_code ec, size_t) {
      if (ec)
        return fail_all(closing_ ? "store client closed" : "connection lost: " + ec.message());
      uint32_t len = wire::decode_length(len_.data());
      if (len < wire::kMinBody || len > kMaxReplyBody)
        return broken("malformed reply length " + std::to_string(len));
      body_.resize(len);
      asio::async_read(sock_, asio::buffer(body_), [this](boost::system::error_code ec, size_t) {
        if (ec)
          return fail_all(closing_ ? "store client closed" : "connection lost: " + ec.message());
        on_reply();
        read_header();
      });
    });
  }

  void on_reply() {
    wire::Reader r(body_.data(), body_.size());
    uint64_t id = r.u64();
    uint8_t status = r.u8();
    std::promise<Reply> p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // the caller already gave up
      p = std::move(it->second);
      pending_.erase(it);
    }
    Reply reply;
    reply.status = static_cast<Status>(status);
    if (status > static_cast<uint8_t>(Status::kError)) reply.status = Status::kError;
    reply.body = std::move(body_);
    body_ = Bytes();
    p.set_value(std::move(reply));
  }

  // Answers request `id`'s caller with an empty reply and forgets the request (a stop).
  void abandon(uint64_t id) {
    std::promise<Reply> p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // answered already
      p = std::move(it->second);
      pending_.erase(it);
    }
    p.set_value(Reply{});
  }

  void write_next() {
    asio::async_write(
        sock_, asio::buffer(out_.front()), [this](boost::system::error_code ec, size_t) {
          if (ec)
            return fail_all(closing_ ? "store client closed" : "connection lost: " + ec.message());
          out_.pop_front();
          if (!out_.empty()) write_next();
        });
  }

  void broken(const std::string& why) {
    boost::system::error_code ec;
    sock_.close(ec);
    fail_all(why);
  }

  void fail_all(const std::string& why) {
    std::unordered_map<uint64_t, std::promise<Reply>> failed;
    {
      std::lock_guard lock(mu_);
      if (broken_.empty()) broken_ = why;
      failed.swap(pending_);
    }
    for (auto& [id, p] : failed)
      p.set_exception(std::make_exception_ptr(CommError("store " + where_ + ": " + why)));
  }

  std::string where_;
  bool binds_ = false;           // set by the handshake, before the io thread starts
  bool watches_owners_ = false;  // likewise
  bool waits_gone_ = false;      // likewise
  asio::io_context io_;
  tcp::socket sock_{io_};
  std::thread thread_;
  // Owned by the io thread.
  std::array<uint8_t, wire::kLengthBytes> len_{};
  Bytes body_;
  std::deque<Bytes> out_;
  bool closing_ = false;
  // Shared with callers.
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;
  std::unordered_map<uint64_t, std::promise<Reply>> pending_;
  std::string broken_;  // non-empty once the connection is unusable
};

TCPStore::TCPStore(TCPStoreOptions options)
    : options_(std::move(options)),
      timeout_ms_(options_.timeout.count()),
      conn_(std::make_unique<Connection>(options_)) {
  ping();
}

TCPStore::TCPStore(const std::string& host, uint16_t port, Millis timeout)
    : TCPStore(TCPStoreOptions{host, port, timeout}) {}

TCPStore::~TCPStore() {
  // A clean close: the server drops this connection's bound keys now rather than after its
  // grace. Best effort; a broken connection or a server that does not answer in time leaves
  // them to the grace.
  if (!conn_->binds()) return;
  try {
    conn_->call(
        Op::kGoodbye, [](wire::Writer&) {}, std::min(timeout(), kGoodbyeWait));
  } catch (...) {
  }
}

bool TCPStore::binds_to_connection() const { return conn_->binds(); }

void TCPStore::set(const std::string& key, const Bytes& value, const SetOptions& options) {
  if (!options.bind) return set(key, value, options.ttl);
  if (!conn_->binds())
    throw NotSupported("store " + options_.host + ":" + std::to_string(options_.port) +
                       ": cannot bind '" + key +
                       "' to the connection: the store server is older than bound keys (its "
                       "handshake does not offer them); use a ttl instead");
  // Before the first bound key: which process this is, so that a server on this machine drops
  // the keys as soon as the process has exited rather than after its grace. Once per
  // connection (a second one from a racing thread says the same).
  if (conn_->watches_owners() && !owner_told_.exchange(true))
    if (const std::optional<ClientProcess> me = this_client_process())
      conn_->call(
          Op::kOwner,
          [&](wire::Writer& w) {
            w.i64(me->pid).u64(me->pid_ns_dev).u64(me->pid_ns_ino).u64(me->start_ticks);
          },
          timeout());
  int64_t ttl_ms = options.ttl ? std::max<int64_t>(clamp_timeout(*options.ttl).count(), 1) : 0;
  conn_->call(
      Op::kSetBound, [&](wire::Writer& w) { w.str(key).bytes(value).i64(ttl_ms); }, timeout());
}

void TCPStore::ping() {
  conn_->call(
      Op::kPing, [](wire::Writer&) {}, timeout());
}

void TCPStore::set(const std::string& key, const Bytes& value, std::optional<Millis> ttl) {
  // 0 on the wire means "no TTL", so a TTL rounds up to at least 1 ms.
  int64_t ttl_ms = ttl ? std::max<int64_t>(clamp_timeout(*ttl).count(), 1) : 0;
  conn_->call(
      Op::kSet, [&](wire::Writer& w) { w.str(key).bytes(value).i64(ttl_ms); }, timeout());
}

Bytes TCPStore::get(const std::string& key) {
  Millis t = clamp_timeout(timeout());
  Reply r = conn_->call(
      Op::kGet, [&](wire::Writer& w) { w.str(key).i64(t.count()); }, t + kReplyGrace);
  return r.payload().bytes();
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  return conn_
      ->call(
          Op::kAdd, [&](wire::Writer& w) { w.str(key).i64(delta); }, timeout())
      .payload()
      .i64();
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Reply r = conn_->call(
      Op::kCompareSet, [&](wire::Writer& w) { w.str(key).bytes(expected).bytes(desired); },
      timeout());
  return r.payload().bytes();
}

void TCPStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  wait_stoppable(keys, timeout, std::stop_token());
}

bool TCPStore::wait_stoppable(const std::vector<std::string>& keys, Millis timeout,
                              std::stop_token stop) {
  timeout = clamp_timeout(timeout);
  return conn_
      ->call(
          Op::kWait, [&](wire::Writer& w) { w.strings(keys).i64(timeout.count()); },
          timeout + kReplyGrace, stop)
      .has_value();
}

bool TCPStore::waits_for_absence() const { return conn_->waits_gone(); }

std::vector<std::string> TCPStore::wait_gone(const std::vector<std::string>& keys, Millis timeout) {
  return *wait_gone_stoppable(keys, timeout, std::stop_token());
}

std::optional<std::vector<std::string>> TCPStore::wait_gone_stoppable(
    const std::vector<std::string>& keys, Millis timeout, std::stop_token stop) {
  if (!conn_->waits_gone())
    throw NotSupported("store " + options_.host + ":" + std::to_string(options_.port) +
                       ": cannot wait for keys to go: the store server is older than that wait "
                       "(its handshake does not offer it); poll check() instead");
  timeout = clamp_timeout(timeout);
  std::optional<Reply> r = conn_->call(
      Op::kWaitGone, [&](wire::Writer& w) { w.strings(keys).i64(timeout.count()); },
      timeout + kReplyGrace, stop);
  if (!r) return std::nullopt;
  return r->payload().strings();
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  return conn_
             ->call(
                 Op::kCheck, [&](wire::Writer& w) { w.strings(keys); }, timeout())
             .payload()
             .u8() != 0;
}

bool TCPStore::erase(const std::string& key) {
  return conn_
             ->call(
                 Op::kErase, [&](wire::Writer& w) { w.str(key); }, timeout())
             .payload()
             .u8() != 0;
}

int64_t TCPStore::num_keys() { return num_keys_with_prefix(""); }

int64_t TCPStore::num_keys_with_prefix(const std::string& prefix) {
  return conn_
      ->call(
          Op::kNumKeys, [&](wire::Writer& w) { w.str(prefix); }, timeout())
      .payload()
      .i64();
}

void TCPStore::append(const std::string& key, const Bytes& value) {
  conn_->call(
      Op::kAppend, [&](wire::Writer& w) { w.str(key).bytes(value); }, timeout());
}

std::vector<Bytes> TCPStore::multi_get(const std::vector<std::string>& keys) {
  Millis t = clamp_timeout(timeout());
  Reply r = conn_->call(
      Op::kMultiGet, [&](wire::Writer& w) { w.strings(keys).i64(t.count()); }, t + kReplyGrace);
  wire::Reader p = r.payload();
  uint32_t n = p.u32();
  if (n != keys.size())
    throw CommError("store: multi_get reply has " + std::to_string(n) + " values for " +
                    std::to_string(keys.size()) + " keys");
  std::vector<Bytes> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(p.bytes());
  return out;
}

void TCPStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  check_multi_set(keys, values);
  conn_->call(
      Op::kMultiSet,
      [&](wire::Writer& w) {
        w.u32(static_cast<uint32_t>(keys.size()));
        for (size_t i = 0; i < keys.size(); ++i) w.str(keys[i]).bytes(values[i]);
      },
      timeout());
}

}  // namespace weft::comm
