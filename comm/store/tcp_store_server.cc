// TCPStoreServer: an Asio accept loop, one Session per connection, waits parked as timers.
// Everything but accept() runs on the server's single thread, so the table and the wait
// index need no locks; accepting has a thread of its own that hands each new socket over,
// and the stats counters are read from other threads.
#include "comm/store/tcp_store_server.h"

// Individual Asio headers: the umbrella pulls in awaitable.hpp, which in Boost 1.74 lacks
// <utility> and fails under GCC 12's C++20 headers.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <future>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "comm/store/auth.h"
#include "comm/store/client_process.h"
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
// A frame's buffer starts at this and doubles as its bytes arrive.
constexpr size_t kReadChunk = 64 << 10;
// Room for keys and framing beyond the longest value, in the default max_frame_bytes.
constexpr size_t kFrameSlack = 1 << 20;
constexpr int kWarnBurst = 20;
}  // namespace

class Session;

// A get / multi_get / wait whose keys were missing: parked until they all exist or its
// timer fires, whichever comes first; `done` makes the loser a no-op. A wait_gone whose keys
// all existed: parked until one of them goes.
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
  // The keys bound to connection `owner` go: after `grace` (0: now).
  void release_bound(KvTable::Owner owner, Millis grace);
  // The connection `owner` closed without a goodbye. `pidfd` >= 0: its client's process
  // (kOwner), whose exit ends the grace: a process that has exited never reconnects, so its
  // keys go now if it has, or when it does within the grace. Takes the pidfd.
  void release_closed(KvTable::Owner owner, int pidfd);
  // WEFT_WARN, at most kWarnBurst lines a second: a flood of bad clients must not flood the
  // log too. The next line that gets through says how many were held back.
  void warn(const std::string& line);
  void finish_waiter(const std::shared_ptr<Waiter>& w, bool timed_out);
  // Finishes the wait_gone waiters of every key the table removed since the last call.
  void notify_removed();
  // kWaitGone's reply: those of `keys` absent now. A waiter woken by a removal is answered
  // in the same handler on this one thread, so the removed key is among them.
  void put_absent(wire::Writer& out, const std::vector<std::string>& keys);
  size_t max_frame() const {
    return opts.max_frame_bytes ? opts.max_frame_bytes : opts.max_value_bytes + kFrameSlack;
  }
  // Connection buffers plus stored keys and values.
  size_t held_total() const { return held + table.bytes(); }
  void note_bytes() {
    uint64_t now = held_total();
    held_now = now;
    if (now > held_peak) held_peak = now;
  }
  // Throws CommError (a refused write, the connection stays) when storing `incoming` more
  // bytes would pass max_total_bytes.
  void check_room(size_t incoming) const;

  TCPStoreServerOptions opts;
  asio::io_context io;
  // Keeps io.run() going while no connection is open.
  asio::executor_work_guard<asio::io_context::executor_type> io_work{io.get_executor()};
  // The listener lives on an io_context of its own, run by accept_thread (see accept()).
  asio::io_context accept_io;
  tcp::acceptor acceptor{accept_io};
  asio::steady_timer accept_retry{accept_io};
  std::thread accept_thread;
  asio::steady_timer expiry{io};
  std::optional<KvTable::Clock::time_point> expiry_armed;
  KvTable table;
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiting;
  // wait_gone waiters by key: finished when any of their keys goes.
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiting_gone;
  // Closed connections in their grace whose client process is watched (release_closed):
  // the process's pidfd, the keys the grace keeps and their deadline, and a timer that stops
  // watching when the grace is over.
  struct ExitWatch {
    ExitWatch(asio::io_context& io, int fd) : pidfd(io, fd), timer(io) {}
    asio::posix::stream_descriptor pidfd;
    asio::steady_timer timer;
    std::vector<KvTable::Released> keys;
    KvTable::Clock::time_point at;
  };
  std::unordered_map<KvTable::Owner, std::shared_ptr<ExitWatch>> exit_watches;
  // Waits (again) for `w`'s process to exit, then drops the keys its grace still keeps.
  void watch_exit(KvTable::Owner owner, const std::shared_ptr<ExitWatch>& w);
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stopped{false};
  KvTable::Clock::time_point warn_window{};
  int warn_count = 0;
  uint64_t warn_suppressed = 0;
  size_t held = 0;                // sum of the sessions' buffers, on the server thread
  KvTable::Owner next_owner = 1;  // each session's id for the keys it binds
  std::atomic<uint64_t> accepted{0}, open{0}, malformed{0}, over_limit{0}, requests{0}, parked{0};
  std::atomic<uint64_t> timed_out{0}, refused{0}, held_now{0}, held_peak{0}, open_peak{0};
  std::atomic<uint64_t> goodbyes{0}, released{0}, dropped_at_exit{0};

 private:
  void accept();
  void start_session(tcp::socket sock);
  void arm_expiry();
  void notify(const std::string& key);
  void park(const std::shared_ptr<Session>& s, uint64_t req, Op op, std::vector<std::string> keys,
            int64_t timeout_ms);
  void unindex(const std::shared_ptr<Waiter>& w);
};

// One client connection: the handshake, then frames read piecewise (memory follows the
// bytes that arrived, never the length a header announces), handed to the server; replies
// queued. One deadline timer enforces the handshake, read and idle timeouts.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TCPStoreServer::Impl& srv, tcp::socket sock)
      : srv_(srv), sock_(std::move(sock)), deadline_(srv.io), owner_(srv.next_owner++) {
    boost::system::error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    peer_loopback_ = !ec && auth::is_loopback(ep.address().to_string());
    sock_.set_option(tcp::no_delay(true), ec);
    set_cloexec(sock_.native_handle());
  }

  // Sends the hello (a fresh nonce) and starts the handshake clock.
  void start() {
    arm(Deadline::kHandshake, srv_.opts.read_timeout);
    nonce_ = auth::random_bytes(auth::kNonceBytes);
    wire::Writer w;
    w.u8(wire::kHandshakeVersion)
        .u8((srv_.opts.token.empty() ? 0 : wire::kHelloTokenRequired) | wire::kHelloBindsKeys |
            wire::kHelloWatchesOwners | wire::kHelloWaitsGone);
    w.bytes(nonce_);
    send(w.finish());
    read_more();
  }
  const std::string& peer() const { return peer_; }
  bool closed() const { return closed_; }
  KvTable::Owner owner() const { return owner_; }
  // The client closes on purpose: its bound keys went already, and any it binds after go
  // at once too when it closes.
  void said_goodbye() { goodbye_ = true; }
  // kOwner: the client's process, watched when it runs on this machine (a loopback peer)
  // in this server's pid namespace. Whether it is.
  bool adopt_owner(const ClientProcess& p) {
    if (!peer_loopback_) return false;
    const int fd = open_client_process(p);
    if (fd < 0) return false;
    if (pidfd_ >= 0) ::close(pidfd_);
    pidfd_ = fd;
    return true;
  }
  ~Session() {
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  void reply(uint64_t req, Status status, wire::Writer&& w) {
    (void)req, (void)status;
    send(w.finish());
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

  // Charges a parked wait to this client; false (and the connection dropped) past a bound.
  bool charge_waiter(const std::shared_ptr<Waiter>& w) {
    waiters_.insert(w);
    waiter_bytes_ += w->bytes;
    return check_limits("parked waits");
  }
  void release_waiter(const std::shared_ptr<Waiter>& w) {
    if (waiters_.erase(w)) waiter_bytes_ -= w->bytes;
    sync();
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
    deadline_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    auto parked = std::move(waiters_);
    waiters_.clear();
    waiter_bytes_ = 0;
    for (const auto& w : parked) srv_.finish_waiter(w, /*timed_out=*/false);
    // Whatever closed it (the client vanished, a limit, a timeout, the server stopping): the
    // keys it bound outlive it by the grace, unless it said goodbye, or its process is known
    // to have exited (kOwner).
    if (goodbye_)
      srv_.release_bound(owner_, Millis(0));
    else
      srv_.release_closed(owner_, std::exchange(pidfd_, -1));
    // out_ stays (an aborted async_write may still name its front buffer until it unwinds)
    // but is no longer charged: it is freed with the session.
    body_ = Bytes();
    out_bytes_ = 0;
    sync();
    srv_.forget(this);
  }

 private:
  enum class Deadline { kNone, kHandshake, kFrame, kIdle };
  using TimePoint = asio::steady_timer::time_point;

  size_t usage() const { return body_.capacity() + out_bytes_ + waiter_bytes_; }
  // Reports this session's usage to the server's total.
  void sync() {
    size_t now = closed_ ? 0 : usage();
    srv_.held = srv_.held + now - charged_;
    charged_ = now;
    srv_.note_bytes();
  }
  // Syncs, then drops the connection if it holds more than its bound or the server more
  // than its total; returns whether it is still open.
  bool check_limits(const std::string& what) {
    sync();
    if (usage() > srv_.opts.max_client_bytes) {
      drop_over_limit("max_client_bytes", srv_.opts.max_client_bytes, usage(), what);
      return false;
    }
    if (srv_.held_total() > srv_.opts.max_total_bytes) {
      drop_over_limit("max_total_bytes", srv_.opts.max_total_bytes, srv_.held_total(), what);
      return false;
    }
    return true;
  }

  void drop_malformed(const std::string& why) {
    ++srv_.malformed;
    close("malformed frame: " + why);
  }
  void drop_over_limit(const char* bound, size_t limit, size_t held, const std::string& what) {
    ++srv_.over_limit;
    close(str("over ", bound, " (", limit, ") with ", held, " bytes held, mostly ", what));
  }

  void send(Bytes frame) {
    if (closed_) return;
    out_bytes_ += frame.size();
    out_.push_back(std::move(frame));
    if (!check_limits("replies it does not read")) return;
    if (!writing_) write_next();
  }

  // --- the deadline: one timer, moved lazily as the connection changes state ---
  // arm() only records when the current state's deadline falls due. The timer is touched
  // only when that is sooner than the timer is set for; otherwise the timer fires first,
  // finds the deadline moved on and sleeps until it. So a frame costs no timer operation,
  // where re-arming per frame cost a cancel, an extra handler and often a timerfd_settime
  // (Asio reprograms the timerfd whenever a new timer is the earliest): 15% of the server's
  // time with 10K clients.
  void arm(Deadline kind, Millis after) {
    deadline_kind_ = kind;
    due_ = kind == Deadline::kNone || after.count() <= 0
               ? TimePoint::max()
               : asio::steady_timer::clock_type::now() + after;
    if (due_ >= timer_at_) return;
    timer_at_ = due_;
    deadline_.expires_at(due_);  // cancels a pending wait: its handler watches the new expiry
    if (!watching_) watch();
  }
  void watch() {
    watching_ = true;
    deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      self->watching_ = false;
      if (self->closed_) return;
      if (ec) return self->watch();  // moved sooner by arm()
      self->timer_at_ = TimePoint::max();
      if (self->due_ == TimePoint::max()) return;  // nothing to time now: asleep until arm()
      if (self->due_ > asio::steady_timer::clock_type::now()) {
        self->timer_at_ = self->due_;
        self->deadline_.expires_at(self->due_);
        return self->watch();
      }
      self->on_deadline();
    });
  }
  void on_deadline() {
    const auto& o = srv_.opts;
    switch (deadline_kind_) {
      case Deadline::kHandshake:
        ++srv_.timed_out;
        return close(str("no handshake within the read timeout (", o.read_timeout.count(), " ms)"));
      case Deadline::kFrame:
        ++srv_.timed_out;
        return close(str("read timeout: a frame started but did not arrive whole within ",
                         o.read_timeout.count(), " ms (", len_got_, " header and ", body_got_,
                         " body bytes received)"));
      case Deadline::kIdle:
        if (!waiters_.empty() || !out_.empty())  // busy, not idle: look again later
          return arm(Deadline::kIdle, o.idle_timeout);
        ++srv_.timed_out;
        return close(str("idle for ", o.idle_timeout.count(), " ms"));
      case Deadline::kNone:
        return;
    }
  }

  // --- reading: header bytes, then the body in growing pieces ---
  void read_more() {
    if (closed_ || refused_) return;
    if (len_got_ < wire::kLengthBytes) {
      sock_.async_read_some(asio::buffer(len_.data() + len_got_, wire::kLengthBytes - len_got_),
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              if (ec || self->closed_) return self->close("");
                              self->on_header_bytes(n);
                            });
      return;
    }
    if (body_got_ == body_.size()) {
      // Grow geometrically, and only as far as bytes have actually come in.
      size_t target = std::min<size_t>(frame_len_, std::max(kReadChunk, body_.size() * 2));
      body_.resize(target);
      if (!check_limits("an incoming frame")) return;
    }
    sock_.async_read_some(asio::buffer(body_.data() + body_got_, body_.size() - body_got_),
                          [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                            if (ec || self->closed_) return self->close("");
                            self->body_got_ += n;
                            if (self->body_got_ == self->frame_len_) return self->on_frame();
                            self->read_more();
                          });
  }

  void on_header_bytes(size_t n) {
    if (len_got_ == 0 && authed_) arm(Deadline::kFrame, srv_.opts.read_timeout);
    len_got_ += n;
    if (len_got_ < wire::kLengthBytes) return read_more();
    uint32_t len = wire::decode_length(len_.data());
    size_t max =
        authed_ ? std::min(srv_.max_frame(), srv_.opts.max_client_bytes) : wire::kMaxHandshakeBody;
    if (len < (authed_ ? wire::kMinBody : 1))
      return drop_malformed("body length " + std::to_string(len) + " below the minimum");
    if (len > max)
      return drop_malformed(str("body length ", len, " exceeds the ",
                                authed_ ? "maximum frame size " : "handshake bound ", max));
    frame_len_ = len;
    body_got_ = 0;
    body_.clear();
    read_more();
  }

  void on_frame() {
    body_.resize(frame_len_);
    if (!authed_) {
      on_proof();
    } else {
      on_body();
    }
    if (closed_ || refused_) return;
    len_got_ = 0;
    body_got_ = 0;
    body_.clear();
    if (body_.capacity() > kKeepBodyCapacity) body_.shrink_to_fit();
    sync();
    arm(Deadline::kIdle, srv_.opts.idle_timeout);
    read_more();
  }

  void on_proof() {
    Bytes proof;
    try {
      wire::Reader r(body_.data(), body_.size());
      uint8_t version = r.u8();
      if (version != wire::kHandshakeVersion)
        return drop_malformed("handshake version " + std::to_string(version));
      proof = r.bytes();
      r.expect_end();
    } catch (const wire::ProtocolError& e) {
      return drop_malformed(std::string("handshake: ") + e.what());
    }
    const auto& o = srv_.opts;
    if (!o.token.empty()) {
      if (proof.empty())
        return refuse("the store requires the job token and the client sent no proof of it");
      if (!auth::proof_matches(auth::proof(o.token, nonce_), proof))
        return refuse("wrong job token");
    } else if (!o.insecure && !peer_loopback_) {
      return refuse("this store has no job token and serves only clients on its own machine");
    }
    authed_ = true;
    wire::Writer w;
    w.u8(static_cast<uint8_t>(Status::kOk));
    send(w.finish());
  }

  // Tells the client why, stops reading, and closes once the verdict is written (or the
  // read timeout passes, if the client does not take it).
  void refuse(const std::string& why) {
    ++srv_.refused;
    srv_.warn(str("refused connection from ", peer_, ": ", why));
    refused_ = true;
    wire::Writer w;
    w.u8(static_cast<uint8_t>(Status::kError)).str("store refused the connection: " + why);
    arm(Deadline::kHandshake, srv_.opts.read_timeout);
    send(w.finish());
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
        // The store refused a well-formed request (value too long, add on text, store
        // full): the client gets the reason, the connection stays.
        reply_error(req, Status::kError, e.what());
      }
      // Any op may have removed keys: an erase, or TTLs that ended, which every table call
      // drops first.
      srv_.notify_removed();
    } catch (const wire::ProtocolError& e) {
      return drop_malformed(e.what());
    } catch (const std::exception& e) {
      // bad_alloc and the like: lose this connection, never the server.
      return close(std::string("internal error: ") + e.what());
    }
  }

  void write_next() {
    writing_ = true;
    asio::async_write(sock_, asio::buffer(out_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (ec || self->closed_) return self->close("");
                        self->out_bytes_ -= self->out_.front().size();
                        self->out_.pop_front();
                        self->writing_ = false;
                        self->sync();
                        if (!self->out_.empty()) return self->write_next();
                        // Refused: counted and logged already, so close without a second line.
                        if (self->refused_) self->close("");
                      });
  }

  static void set_cloexec(int fd) {
    int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }

  TCPStoreServer::Impl& srv_;
  tcp::socket sock_;
  asio::steady_timer deadline_;
  Deadline deadline_kind_ = Deadline::kNone;
  TimePoint due_ = TimePoint::max();       // when the current state's deadline falls due
  TimePoint timer_at_ = TimePoint::max();  // what deadline_ is set for; max: not waiting
  bool watching_ = false;                  // an async_wait on deadline_ is pending
  std::string peer_;
  bool peer_loopback_ = false;
  Bytes nonce_;
  bool authed_ = false;
  bool refused_ = false;
  std::array<uint8_t, wire::kLengthBytes> len_{};
  size_t len_got_ = 0;
  uint32_t frame_len_ = 0;
  size_t body_got_ = 0;
  Bytes body_;
  std::deque<Bytes> out_;
  size_t out_bytes_ = 0;
  bool writing_ = false;
  std::unordered_set<std::shared_ptr<Waiter>> waiters_;
  size_t waiter_bytes_ = 0;
  size_t charged_ = 0;  // usage() as last reported to srv_.held
  bool closed_ = false;
  const KvTable::Owner owner_;  // this connection, for the keys it binds
  bool goodbye_ = false;
  int pidfd_ = -1;  // the client's process (kOwner), when watched
};

TCPStoreServer::Impl::Impl(TCPStoreServerOptions o)
    : opts(std::move(o)), table(opts.max_value_bytes) {
  table.log_removals(true);  // for wait_gone (notify_removed)
  if (opts.token.empty() && !opts.insecure && !auth::is_loopback(opts.host))
    throw ConfigError("WEFT_JOB_TOKEN",
                      "a store listening on " + opts.host +
                          " (not loopback) needs a job token: set WEFT_JOB_TOKEN, or listen on "
                          "127.0.0.1, or accept any client with --insecure");
  try {
    tcp::resolver resolver(io);
    auto endpoints = resolver.resolve(opts.host, std::to_string(opts.port), tcp::resolver::passive);
    tcp::endpoint ep = *endpoints.begin();
    acceptor.open(ep.protocol());
    // Close-on-exec: workers the host process spawns must not inherit the listening socket,
    // or the port stays taken after the host is gone.
    int fd = acceptor.native_handle();
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(asio::socket_base::max_listen_connections);
    port = acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    std::string what =
        "store: cannot listen on " + opts.host + ":" + std::to_string(opts.port) + ": " + e.what();
    if (e.code() == boost::asio::error::address_in_use) throw AddressInUseError(what);
    throw CommError(what);
  }
  accept();
  accept_thread = std::thread([this] {
    for (;;) {
      try {
        accept_io.run();
        return;
      } catch (const std::exception& e) {  // bad_alloc: log, and accept again
        asio::post(io, [this, m = std::string("accept failed: ") + e.what()] { warn(m); });
        if (stopped) return;
        accept();
      }
    }
  });
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

// Accepting has its own thread, which does nothing else: each socket is accepted into `io`
// and handed to the server thread. Accepted on the server thread, between the handlers of
// the connections it serves, a burst of connects (a 10K-worker job starting) overflowed the
// kernel's accept queue (somaxconn, 4096 here) and every SYN dropped there cost its client a
// 1 s retransmit: 10K clients took 2.3 s to connect, 3.5K of them dropped once.
void TCPStoreServer::Impl::accept() {
  acceptor.async_accept(io, [this](boost::system::error_code ec, tcp::socket sock) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors and the like: back off instead of spinning.
      asio::post(io, [this, m = "accept failed: " + ec.message()] { warn(m); });
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](boost::system::error_code e) {
        if (!e) accept();
      });
      return;
    }
    asio::post(io, [this, sock = std::move(sock)]() mutable { start_session(std::move(sock)); });
    accept();
  });
}

void TCPStoreServer::Impl::start_session(tcp::socket sock) {
  auto s = std::make_shared<Session>(*this, std::move(sock));
  sessions[s.get()] = s;
  ++accepted;
  if (++open > open_peak) open_peak = open.load();
  s->start();
}

void TCPStoreServer::Impl::check_room(size_t incoming) const {
  if (held_total() + incoming > opts.max_total_bytes)
    throw CommError("store: full: it holds " + std::to_string(held_total()) +
                    " bytes and this write brings " + std::to_string(incoming) +
                    " more, past max_total_bytes " + std::to_string(opts.max_total_bytes));
}

void TCPStoreServer::Impl::forget(Session* s) {
  if (sessions.erase(s)) --open;
}

void TCPStoreServer::Impl::release_bound(KvTable::Owner owner, Millis grace) {
  size_t n = table.release(owner, grace);
  if (n == 0) return;
  released += n;
  WEFT_DEBUG("store", "released ", n, " bound keys of connection ", owner, " (grace ",
             grace.count(), " ms)");
  arm_expiry();
  note_bytes();
}

void TCPStoreServer::Impl::release_closed(KvTable::Owner owner, int pidfd) {
  const Millis grace = opts.bound_key_grace;
  if (pidfd < 0) return release_bound(owner, grace);
  pollfd p{pidfd, POLLIN, 0};
  const bool exited = ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
  if (exited || grace <= Millis(0) || table.bound_to(owner) == 0) {
    ::close(pidfd);
    // Counted before the release, whose removals answer parked wait_gone calls: a client
    // woken by one must find the drop counted.
    if (exited) dropped_at_exit += table.bound_to(owner);
    release_bound(owner, exited ? Millis(0) : grace);
    return;
  }
  // Still running (its sockets close in the kernel's exit before the process is reaped, or
  // it lives and reconnects): the grace as usual, cut short if the process exits within it.
  auto w = std::make_shared<ExitWatch>(io, pidfd);
  const size_t n = table.release(owner, grace, &w->keys, &w->at);
  released += n;
  WEFT_DEBUG("store", "released ", n, " bound keys of connection ", owner, " (grace ",
             grace.count(), " ms, or until its process exits)");
  arm_expiry();
  note_bytes();
  exit_watches[owner] = w;
  watch_exit(owner, w);
  w->timer.expires_at(w->at);
  w->timer.async_wait(
      [this, owner, weak = std::weak_ptr<ExitWatch>(w)](boost::system::error_code ec) {
        auto w = weak.lock();
        if (ec || !w) return;
        boost::system::error_code ignored;
        w->pidfd.cancel(ignored);
        exit_watches.erase(owner);
      });
}

void TCPStoreServer::Impl::watch_exit(KvTable::Owner owner, const std::shared_ptr<ExitWatch>& w) {
  std::weak_ptr<ExitWatch> weak = w;
  w->pidfd.async_wait(asio::posix::stream_descriptor::wait_read,
                      [this, owner, weak](boost::system::error_code ec) {
                        auto w = weak.lock();
                        if (ec || !w) return;  // cancelled: the grace ended first
                        // The reactor may wake a waiter without the pidfd being readable
                        // (seen here): only a readable pidfd says the process exited.
                        pollfd p{w->pidfd.native_handle(), POLLIN, 0};
                        if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLIN))
                          return watch_exit(owner, w);
                        const size_t gone = table.drop_released(w->keys);
                        dropped_at_exit += gone;
                        notify_removed();
                        WEFT_DEBUG("store", "connection ", owner, "'s process exited: ", gone,
                                   " bound keys dropped before the grace ended");
                        note_bytes();
                        w->timer.cancel();
                        exit_watches.erase(owner);
                      });
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
  // The listener first, so that no connection is handed over after the others are closed.
  asio::post(accept_io, [this] {
    boost::system::error_code ec;
    acceptor.close(ec);
    accept_retry.cancel();
  });
  if (accept_thread.joinable()) accept_thread.join();
  std::promise<void> done;
  asio::post(io, [this, &done] {
    expiry.cancel();
    auto all = sessions;
    for (auto& [p, s] : all) s->close("");
    exit_watches.clear();  // closes their pidfds; their handlers find them gone
    done.set_value();
  });
  // Bounded: if the thread already died the post never runs, so do not wait forever.
  done.get_future().wait_for(std::chrono::seconds(10));
  io.stop();
  if (thread.joinable()) thread.join();
}

void TCPStoreServer::Impl::arm_expiry() {
  auto next = table.expire();
  notify_removed();
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
  // The key's waiters are taken out of the index whole, so unindex() of each one woken here
  // finds nothing to erase under this key: waking N waiters of one key (a barrier) is O(N),
  // where erasing each from the vector was O(N^2), 50M compares at 10K. Those still missing
  // another key go back.
  std::vector<std::shared_ptr<Waiter>> candidates = std::move(it->second);
  waiting.erase(it);
  std::vector<std::shared_ptr<Waiter>> still;
  for (const auto& w : candidates) {
    if (w->done) continue;
    if (table.contains_all(w->keys))
      finish_waiter(w, false);
    else
      still.push_back(w);
  }
  // A reply above can close a session, which finishes its other waiters: drop those.
  std::erase_if(still, [](const auto& w) { return w->done; });
  if (still.empty()) return;
  auto& back = waiting[key];
  back.insert(back.end(), still.begin(), still.end());
}

void TCPStoreServer::Impl::put_absent(wire::Writer& out, const std::vector<std::string>& keys) {
  std::vector<std::string> absent;
  for (const auto& k : keys)
    if (!table.find(k)) absent.push_back(k);
  out.strings(absent);
}

void TCPStoreServer::Impl::notify_removed() {
  for (std::vector<std::string> gone = table.take_removed(); !gone.empty();
       gone = table.take_removed()) {
    for (const auto& key : gone) {
      auto it = waiting_gone.find(key);
      if (it == waiting_gone.end()) continue;
      // Taken out whole, as in notify(): each finished waiter's unindex finds nothing here.
      std::vector<std::shared_ptr<Waiter>> woken = std::move(it->second);
      waiting_gone.erase(it);
      for (const auto& w : woken) finish_waiter(w, false);
    }
  }
}

void TCPStoreServer::Impl::unindex(const std::shared_ptr<Waiter>& w) {
  auto& index = w->op == Op::kWaitGone ? waiting_gone : waiting;
  for (const auto& k : w->keys) {
    auto it = index.find(k);
    if (it == index.end()) continue;
    std::erase(it->second, w);
    if (it->second.empty()) index.erase(it);
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
  auto& index = op == Op::kWaitGone ? waiting_gone : waiting;
  for (const auto& k : w->keys) index[k].push_back(w);
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
    return s->reply_error(w->request, Status::kTimeout,
                          w->op == Op::kWaitGone ? gone_timeout_message(w->keys, w->timeout)
                                                 : timeout_message(w->keys, w->timeout));
  auto out = Session::header(w->request, Status::kOk);
  if (w->op == Op::kWaitGone) put_absent(out, w->keys);
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
    case Op::kSet:
    case Op::kSetBound: {
      std::string key = r.str();
      Bytes value = r.bytes();
      int64_t ttl = r.i64();
      r.expect_end();
      check_room(key.size() + value.size());
      table.set(key, std::move(value), ttl > 0 ? std::optional<Millis>(Millis(ttl)) : std::nullopt,
                op == Op::kSetBound ? s->owner() : KvTable::kNoOwner);
      notify(key);
      break;
    }
    case Op::kOwner: {
      ClientProcess p;
      p.pid = r.i64();
      p.pid_ns_dev = r.u64();
      p.pid_ns_ino = r.u64();
      p.start_ticks = r.u64();
      r.expect_end();
      ok.u8(s->adopt_owner(p) ? 1 : 0);
      break;
    }
    case Op::kGoodbye:
      r.expect_end();
      ++goodbyes;
      s->said_goodbye();
      release_bound(s->owner(), Millis(0));
      break;
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
    case Op::kWaitGone: {
      std::vector<std::string> keys = r.strings();
      int64_t timeout_ms = r.i64();
      r.expect_end();
      ++requests;
      if (!table.contains_all(keys) || keys.empty()) {
        put_absent(ok, keys);
        return s->reply(req, Status::kOk, std::move(ok));
      }
      if (timeout_ms <= 0)
        return s->reply_error(req, Status::kTimeout, gone_timeout_message(keys, Millis(0)));
      return park(s, req, op, std::move(keys), timeout_ms);
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
      check_room(key.size() + desired.size());
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
      check_room(key.size() + value.size());
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
      size_t incoming = 0;
      for (size_t i = 0; i < keys.size(); ++i) incoming += keys[i].size() + values[i].size();
      check_room(incoming);
      table.multi_set(keys, values);
      for (const auto& k : keys) notify(k);
      break;
    }
  }
  ++requests;
  arm_expiry();
  note_bytes();
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
  s.connections_open_peak = impl_->open_peak;
  s.dropped_malformed = impl_->malformed;
  s.dropped_over_limit = impl_->over_limit;
  s.requests = impl_->requests;
  s.waits_parked = impl_->parked;
  s.dropped_timeout = impl_->timed_out;
  s.refused_auth = impl_->refused;
  s.bytes_held = impl_->held_now;
  s.bytes_held_peak = impl_->held_peak;
  s.goodbyes = impl_->goodbyes;
  s.bound_keys_released = impl_->released;
  s.bound_keys_dropped_at_exit = impl_->dropped_at_exit;
  return s;
}

}  // namespace weft::comm
