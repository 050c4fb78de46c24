// The agents' TCP transport: deadline-bounded Asio operations on a private io_context per
// connection, the mutual HMAC handshake, frames, and the listener's accept and session
// threads.
#include "checkpoint/snapshot_transport.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>
#include <stdexcept>

#include "base/check.h"
#include "base/error.h"
#include "base/host.h"
#include "comm/store/auth.h"

namespace weft::checkpoint {

namespace asio = boost::asio;
namespace auth = comm::auth;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kChunkBytes = size_t(8) << 20;  // one composed read or write
constexpr int kVersion = 1;

std::string hex(const comm::Bytes& b) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t x : b) {
    s.push_back(digits[x >> 4]);
    s.push_back(digits[x & 15]);
  }
  return s;
}

// Hex text -> bytes; nullopt-like empty result with ok=false for anything else.
bool unhex(const std::string& s, comm::Bytes* out) {
  if (s.size() % 2) return false;
  out->clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    uint8_t v = 0;
    auto [end, ec] = std::from_chars(s.data() + i, s.data() + i + 2, v, 16);
    if (ec != std::errc() || end != s.data() + i + 2) return false;
    out->push_back(v);
  }
  return true;
}

// A peer the listener turns away during the handshake: logged and counted, not an error of
// the connection.
struct RefusedPeer : IoError {
  using IoError::IoError;
};

std::string text_field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    throw IoError(std::string("handshake without \"") + key + "\"");
  return j[key].get<std::string>();
}

}  // namespace

// ---- a connection ----------------------------------------------------------------------

struct PeerChannel::Io {
  asio::io_context io;
  tcp::socket sock{io};
  bool broken = false;

  void close() {
    boost::system::error_code ignored;
    sock.shutdown(tcp::socket::shutdown_both, ignored);
    sock.close(ignored);
  }
};

PeerChannel::PeerChannel(std::chrono::milliseconds timeout)
    : io_(std::make_unique<Io>()), timeout_(timeout) {}

PeerChannel::~PeerChannel() { io_->close(); }

bool PeerChannel::open() const { return io_->sock.is_open() && !io_->broken && !aborted_; }

bool PeerChannel::cap_receive_buffer(int bytes) {
  boost::system::error_code ec;
  io_->sock.set_option(asio::socket_base::receive_buffer_size(bytes), ec);
  return !ec;
}

void PeerChannel::abort() {
  aborted_ = true;
  io_->io.stop();  // thread-safe: the call in progress returns from its run loop
}

void PeerChannel::fail(const std::string& what) {
  io_->broken = true;
  io_->close();
  throw IoError("snapshot peer " + peer_ + ": " + what);
}

namespace {

// How often a call in progress checks whether bytes moved (its deadline then moves on).
constexpr std::chrono::milliseconds kProgressCheck{100};

// Bytes this socket has queued to send that the peer has not acknowledged yet (SIOCOUTQ):
// they drain while a sender waits for its reply, which is progress too.
int64_t unsent_bytes(tcp::socket& sock) {
  int n = 0;
  if (::ioctl(sock.native_handle(), SIOCOUTQ, &n) != 0) return 0;
  return n;
}

// Runs the operation `start` posts until it calls back, an abort, or `timeout` passes with no
// bytes moved: neither `moved()` (the operation's own count) grew nor the socket's unsent
// bytes shrank. So a long payload on a slow link is never cut while it moves, and a reply
// awaited while the request's last bytes still drain from the send buffer is not either;
// a hung peer is one that moves nothing for `timeout`. False on a timeout or an abort (the
// socket is then closed and the operation's handler has run).
template <typename Start, typename Moved>
bool run_op(asio::io_context& io, tcp::socket& sock, const std::atomic<bool>& aborted,
            std::chrono::milliseconds timeout, boost::system::error_code& ec, Start start,
            Moved moved) {
  io.restart();
  if (aborted) return false;
  bool done = false;
  start([&](boost::system::error_code e) {
    ec = e;
    done = true;
  });
  auto progress = [&] { return int64_t(moved()) - unsent_bytes(sock); };
  int64_t last = progress();
  auto deadline = Clock::now() + timeout;
  while (!done && !aborted && !io.stopped()) {
    const auto now = Clock::now();
    if (const int64_t p = progress(); p != last) {
      last = p;
      deadline = now + timeout;
    }
    if (now >= deadline) break;
    io.run_until(std::min(deadline, now + kProgressCheck));
  }
  if (done) return true;
  boost::system::error_code ignored;
  sock.close(ignored);
  io.restart();
  io.run();  // the cancelled handler runs now, before `done` and `ec` go out of scope
  return false;
}

template <typename Start>
bool run_op(asio::io_context& io, tcp::socket& sock, const std::atomic<bool>& aborted,
            std::chrono::milliseconds timeout, boost::system::error_code& ec, Start start) {
  return run_op(io, sock, aborted, timeout, ec, start, [] { return size_t(0); });
}

// Reads (kWrite false) or writes n bytes at p, in composed operations of up to kChunkBytes;
// "" when done, else why not (the socket is then closed or the run aborted).
// `started` (when given) says whether any byte moved, so that a caller can tell a peer that
// never began from one that stopped midway.
template <bool kWrite>
std::string move_bytes(asio::io_context& io, tcp::socket& sock, const std::atomic<bool>& aborted,
                       std::chrono::milliseconds timeout, char* p, size_t n,
                       bool* started = nullptr) {
  for (size_t off = 0; off < n;) {
    const size_t len = std::min(kChunkBytes, n - off);
    boost::system::error_code ec;
    size_t moved = 0;  // of this chunk, as the composed operation counts it
    // Each system call moves as much as the socket has or takes, up to the rest of the chunk:
    // asio::transfer_all() caps every read or write at 64 KiB, a wake-up of the connection's
    // reactor per 64 KiB, which halved loopback throughput against a plain socket's.
    auto counted = [&moved, len](const boost::system::error_code& e, size_t k) -> size_t {
      moved = k;
      return e ? 0 : len - k;
    };
    const bool done = run_op(
        io, sock, aborted, timeout, ec,
        [&](auto cb) {
          auto finished = [cb](boost::system::error_code e, size_t) { cb(e); };
          if constexpr (kWrite)
            asio::async_write(sock, asio::buffer(p + off, len), counted, finished);
          else
            asio::async_read(sock, asio::buffer(p + off, len), counted, finished);
        },
        [&] { return moved; });
    if (started) *started = *started || off > 0 || moved > 0;
    if (!done)
      return aborted ? "aborted"
                     : "no bytes moved for " + std::to_string(timeout.count()) +
                           " ms (the peer is hung or the link is cut)";
    if (ec == asio::error::eof) return "closed the connection";
    if (ec) return std::string(kWrite ? "write" : "read") + " failed: " + ec.message();
    off += len;
  }
  return {};
}

}  // namespace

void PeerChannel::send_bytes(const void* data, size_t n) {
  if (!open()) fail("the connection is closed");
  const std::string why = move_bytes<true>(io_->io, io_->sock, aborted_, timeout_,
                                           const_cast<char*>(static_cast<const char*>(data)), n);
  if (!why.empty()) fail(why);
}

void PeerChannel::receive_bytes(void* data, size_t n) {
  if (!open()) fail("the connection is closed");
  const std::string why =
      move_bytes<false>(io_->io, io_->sock, aborted_, timeout_, static_cast<char*>(data), n);
  if (!why.empty()) fail(why);
}

void PeerChannel::send(const json& message) {
  const std::string text = message.dump(-1, ' ', false, json::error_handler_t::replace);
  WEFT_CHECK(text.size() <= kPeerMaxMessageBytes, "a snapshot peer message of ", text.size(),
             " bytes");
  uint8_t frame[4];
  const uint32_t n = uint32_t(text.size());
  for (int i = 0; i < 4; ++i) frame[i] = uint8_t(n >> (8 * i));
  std::string out(reinterpret_cast<const char*>(frame), 4);
  out += text;
  send_bytes(out.data(), out.size());
}

json PeerChannel::receive() {
  uint8_t frame[4];
  receive_bytes(frame, 4);
  return receive_body(frame);
}

json PeerChannel::receive_request() {
  if (!open()) fail("the connection is closed");
  uint8_t frame[4];
  bool started = false;
  const std::string why = move_bytes<false>(io_->io, io_->sock, aborted_, timeout_,
                                            reinterpret_cast<char*>(frame), 4, &started);
  if (why.empty()) return receive_body(frame);
  if (started || aborted_ || why.rfind("no bytes moved", 0) != 0) fail(why);
  io_->broken = true;
  io_->close();
  throw IdlePeer("snapshot peer " + peer_ + ": no request for " +
                 std::to_string(timeout_.count()) + " ms: an idle connection, closed");
}

json PeerChannel::receive_body(const uint8_t frame[4]) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t(frame[i]) << (8 * i);
  if (n > kPeerMaxMessageBytes)
    fail("a frame of " + std::to_string(n) + " bytes (at most " +
         std::to_string(kPeerMaxMessageBytes) + "): not a snapshot peer");
  std::string text(n, '\0');
  receive_bytes(text.data(), n);
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw std::invalid_argument("not an object");
    return j;
  } catch (const std::exception& e) {
    fail(std::string("a frame that is not a JSON object (") + e.what() + ")");
  }
  return {};
}

std::unique_ptr<PeerChannel> PeerChannel::connect(const std::string& endpoint, const PeerAuth& a,
                                                  int node, std::chrono::milliseconds timeout) {
  std::unique_ptr<PeerChannel> ch(new PeerChannel(timeout));
  ch->peer_ = endpoint;
  std::pair<std::string, uint16_t> hp;
  try {
    hp = split_endpoint(endpoint);
  } catch (const std::invalid_argument& e) {
    throw IoError(std::string("snapshot peer: ") + e.what());
  }
  tcp::resolver resolver(ch->io_->io);
  boost::system::error_code ec;
  const auto found = resolver.resolve(hp.first, std::to_string(hp.second), ec);
  if (ec || found.empty())
    throw IoError("snapshot peer " + endpoint + ": cannot resolve " + hp.first + ": " +
                  ec.message());
  if (!run_op(ch->io_->io, ch->io_->sock, ch->aborted_, timeout, ec, [&](auto cb) {
        asio::async_connect(ch->io_->sock, found,
                            [cb](boost::system::error_code e, const tcp::endpoint&) { cb(e); });
      }))
    throw IoError("snapshot peer " + endpoint + ": no connection within " +
                  std::to_string(timeout.count()) + " ms");
  if (ec) throw IoError("snapshot peer " + endpoint + ": cannot connect: " + ec.message());
  ch->io_->sock.set_option(tcp::no_delay(true), ec);
  ::fcntl(ch->io_->sock.native_handle(), F_SETFD, FD_CLOEXEC);

  const json hello = ch->receive();
  if (hello.value("weft", "") != "snapshot-peer" || hello.value("version", 0) != kVersion)
    ch->fail("not a weft snapshot agent (or another version of its protocol): " +
             hello.dump().substr(0, 200));
  const std::string job = hello.value("job", "");
  if (job != a.job) ch->fail("serves job " + job + ", not " + a.job);
  const bool wants_token = hello.value("token", false);
  if (wants_token && a.token.empty())
    ch->fail("it requires the job token and this agent has none (WEFT_JOB_TOKEN)");
  if (!wants_token && !a.token.empty())
    ch->fail("it has no job token while this job has one: not this job's agent; nothing is sent");
  comm::Bytes n1, n2 = auth::random_bytes(auth::kNonceBytes);
  if (!unhex(hello.value("nonce", ""), &n1) || n1.size() != auth::kNonceBytes)
    ch->fail("a handshake without a valid nonce");
  ch->send(
      {{"job", a.job},
       {"node", node},
       {"nonce", hex(n2)},
       {"proof", a.token.empty() ? "" : hex(auth::proof(a.token, n1, n2, kPeerClientContext))}});
  const json verdict = ch->receive();
  if (!verdict.value("ok", false))
    ch->fail("refused the connection: " + verdict.value("error", std::string("(no reason)")));
  if (!a.token.empty()) {
    comm::Bytes got;
    if (!unhex(verdict.value("proof", ""), &got) ||
        !auth::proof_matches(auth::proof(a.token, n2, n1, kPeerServerContext), got))
      ch->fail(
          "cannot prove the job token (a wrong proof): not this job's agent; nothing is "
          "sent to it");
  }
  return ch;
}

void PeerChannel::handshake_as_listener(const PeerAuth& a) {
  const comm::Bytes n1 = auth::random_bytes(auth::kNonceBytes);
  send({{"weft", "snapshot-peer"},
        {"version", kVersion},
        {"job", a.job},
        {"nonce", hex(n1)},
        {"token", !a.token.empty()}});
  const json h = receive();
  auto refuse = [&](const std::string& why) {
    try {
      send({{"ok", false}, {"error", why}});
    } catch (const std::exception&) {
    }
    io_->broken = true;
    io_->close();
    throw RefusedPeer(why);
  };
  std::string job, nonce, proof;
  try {
    job = text_field(h, "job");
    nonce = text_field(h, "nonce");
    proof = text_field(h, "proof");
  } catch (const IoError& e) {
    refuse(std::string("a malformed handshake: ") + e.what());
  }
  if (job != a.job) refuse("it belongs to job " + job + ", this agent serves job " + a.job);
  comm::Bytes n2, got;
  if (!unhex(nonce, &n2) || n2.size() != auth::kNonceBytes)
    refuse("a malformed handshake (its nonce)");
  if (!a.token.empty()) {
    if (proof.empty()) refuse("it sent no proof of the job token (it has none)");
    if (!unhex(proof, &got) ||
        !auth::proof_matches(auth::proof(a.token, n1, n2, kPeerClientContext), got))
      refuse("wrong job token (its proof does not match)");
  } else if (!a.insecure) {
    const std::string host = peer_.substr(0, peer_.rfind(':'));
    if (!auth::is_loopback(host))
      refuse("this agent has no job token and accepts peers on its own machine only");
  }
  peer_node_ = h.contains("node") && h["node"].is_number_integer() ? h["node"].get<int>() : -1;
  send({{"ok", true},
        {"proof",
         a.token.empty() ? std::string() : hex(auth::proof(a.token, n2, n1, kPeerServerContext))}});
}

// ---- the listener ----------------------------------------------------------------------

struct PeerListener::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
};

PeerListener::PeerListener(const std::string& host, uint16_t port, PeerAuth auth, Serve serve,
                           Log log, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()),
      auth_(std::move(auth)),
      serve_(std::move(serve)),
      log_(std::move(log)),
      timeout_(timeout),
      host_(host) {
  try {
    tcp::resolver resolver(impl_->io);
    const tcp::endpoint ep =
        *resolver.resolve(host, std::to_string(port), tcp::resolver::passive).begin();
    impl_->acceptor.open(ep.protocol());
    ::fcntl(impl_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(asio::socket_base::max_listen_connections);
    port_ = impl_->acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw IoError("snapshot agent: cannot listen for peers on " + host + ":" +
                  std::to_string(port) + ": " + e.what());
  }
  accept_next();
  thread_ = std::thread([this] { impl_->io.run(); });
}

PeerListener::~PeerListener() { stop(); }

std::string PeerListener::endpoint() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

void PeerListener::accept_next() {
  auto s = std::make_unique<Session>();
  s->channel.reset(new PeerChannel(timeout_));
  Session* raw = s.get();
  tcp::socket& sock = s->channel->io_->sock;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;
    sessions_.push_back(std::move(s));
  }
  impl_->acceptor.async_accept(sock, [this, raw](boost::system::error_code ec) {
    if (ec) {
      raw->done = true;
      if (ec != asio::error::operation_aborted) {
        log_("peer listener: accept failed: " + ec.message());
        accept_next();
      }
      return;
    }
    boost::system::error_code e2;
    const tcp::endpoint ep = raw->channel->io_->sock.remote_endpoint(e2);
    raw->channel->peer_ =
        e2 ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    raw->channel->io_->sock.set_option(tcp::no_delay(true), e2);
    ::fcntl(raw->channel->io_->sock.native_handle(), F_SETFD, FD_CLOEXEC);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!stopped_)
        raw->thread = std::thread([this, raw] { run_session(*raw); });
      else
        raw->done = true;
    }
    reap(false);
    accept_next();
  });
}

void PeerListener::run_session(Session& s) {
  PeerChannel& ch = *s.channel;
  try {
    ch.handshake_as_listener(auth_);
  } catch (const RefusedPeer& e) {
    ++refused_;
    log_("refused a peer connection from " + ch.peer() + ": " + e.what());
    s.done = true;
    return;
  } catch (const std::exception& e) {
    if (!ch.aborted_)
      log_("a peer connection from " + ch.peer() + " failed its handshake: " + e.what());
    s.done = true;
    return;
  }
  try {
    serve_(ch);
  } catch (const IdlePeer&) {
    // The peer had nothing to send for a while; it connects anew when it has.
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (!ch.aborted_ && what.find("closed the connection") == std::string::npos)
      log_("peer " + ch.peer() + ": " + what);
  }
  ch.io_->close();
  s.done = true;
}

// Joins the sessions that ended (all of them, aborting the rest, when `all`).
void PeerListener::reap(bool all) {
  std::vector<std::unique_ptr<Session>> ended;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (all || (*it)->done) {
        ended.push_back(std::move(*it));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : ended) {
    s->channel->abort();
    if (s->thread.joinable()) s->thread.join();
  }
}

void PeerListener::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_ && !thread_.joinable()) return;
    stopped_ = true;
  }
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
  });
  if (thread_.joinable()) thread_.join();
  reap(true);
}

}  // namespace weft::checkpoint
