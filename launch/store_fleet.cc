// The clients of `weft bench store`: one state machine per connection on a shared
// io_context. A client has at most one operation in flight (write a request, then read its
// reply), so its handlers never overlap even when several threads run the context.
#include "launch/store_fleet.h"

// Individual Asio headers: the umbrella pulls in awaitable.hpp, which in Boost 1.74 lacks
// <utility> and fails under GCC 12's C++20 headers.
#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "base/check.h"
#include "base/error.h"
#include "comm/store/auth.h"
#include "comm/store/protocol.h"

namespace weft::launch {
namespace {

namespace asio = boost::asio;
namespace wire = comm::wire;
using tcp = asio::ip::tcp;
using comm::Bytes;
using wire::Op;
using wire::Status;
using Clock = std::chrono::steady_clock;
using Then = std::function<void(wire::Reader&)>;
using Args = std::function<void(wire::Writer&)>;

constexpr uint32_t kMaxReplyBody = 1 << 20;  // the bench's values are 32 bytes
// Connect retries back off as TCPStore's constructor does.
constexpr comm::Millis kFirstBackoff{20}, kMaxBackoff{1'000};

double seconds_since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

// What every client shares: the io_context, the server's address, the counters and the first
// failure. A failure stops the whole fleet: a rendezvous with a lost member is a failed one.
struct Fleet {
  explicit Fleet(const FleetOptions& o)
      : opts(o), ep(asio::ip::make_address(o.host), o.port), watchdog(io) {}

  void note_connected() {
    int now = ++connected;
    int peak_seen = peak.load();
    while (now > peak_seen && !peak.compare_exchange_weak(peak_seen, now)) {
    }
  }
  void fail(const std::string& why) {
    {
      std::lock_guard lock(mu);
      if (error.empty()) error = why;
    }
    io.stop();
  }
  std::string first_error() {
    std::lock_guard lock(mu);
    return error;
  }
  // One more client finished its part; the last one stops the io_context.
  void end_one(int total) {
    if (++ended == total) io.stop();
  }
  // Runs the io_context on opts.threads threads until stopped, or until the timeout.
  void run() {
    watchdog.expires_after(opts.timeout);
    watchdog.async_wait([this](boost::system::error_code ec) {
      if (!ec) fail(str("timed out after ", opts.timeout.count(), " ms"));
    });
    std::vector<std::thread> more;
    for (int i = 1; i < opts.threads; ++i) more.emplace_back([this] { io.run(); });
    io.run();
    for (auto& t : more) t.join();
  }

  FleetOptions opts;
  asio::io_context io;
  tcp::endpoint ep;
  asio::steady_timer watchdog;
  std::atomic<int> connected{0}, peak{0}, retries{0}, ended{0};
  std::mutex mu;
  std::string error;
};

// One connection: connect (retrying), the token handshake and a ping, then the scenario's
// requests through call().
class Client {
 public:
  Client(Fleet& f, int index) : f_(f), index_(index), sock_(f.io), backoff_timer_(f.io) {}
  virtual ~Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void connect() {
    if (started_ == Clock::time_point{}) started_ = Clock::now();
    sock_.async_connect(f_.ep, [this](boost::system::error_code ec) {
      if (!ec) {
        sock_.set_option(tcp::no_delay(true), ec);
        return handshake();
      }
      boost::system::error_code ignored;
      sock_.close(ignored);
      ++f_.retries;
      if (Clock::now() - started_ > f_.opts.timeout) return fail("connect: " + ec.message());
      backoff_timer_.expires_after(backoff_);
      backoff_ = std::min(backoff_ * 2, kMaxBackoff);
      backoff_timer_.async_wait([this](boost::system::error_code) { connect(); });
    });
  }

  Clock::time_point started() const { return started_; }
  Clock::time_point connected_at() const { return connected_at_; }

 protected:
  virtual void on_connected() = 0;

  // Sends one request and hands the payload of its kOk reply to `then`; any other reply
  // fails the client.
  void call(Op op, const Args& args, Then then) {
    uint64_t id = next_id_++;
    wire::Writer w;
    w.u64(id).u8(static_cast<uint8_t>(op));
    args(w);
    exchange(w.finish(), kMaxReplyBody, [this, id, op, then = std::move(then)](wire::Reader& r) {
      uint64_t got = r.u64();
      uint8_t status = r.u8();
      if (got != id) return fail(str("reply to request ", got, ", expected ", id));
      if (status != static_cast<uint8_t>(Status::kOk))
        return fail(std::string(wire::op_name(op)) + ": " + r.str());
      then(r);
    });
  }
  void fail(const std::string& why) { f_.fail(str("client ", index_, ": ", why)); }
  void disconnect() {
    boost::system::error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
    --f_.connected;
  }

  Fleet& f_;
  const int index_;

 private:
  // Hello (a nonce) in, proof out, verdict in: as TCPStore's constructor, then its ping.
  void handshake() {
    read_frame(wire::kMaxHandshakeBody, [this](wire::Reader& hello) {
      uint8_t version = hello.u8();
      hello.u8();  // flags: the bench always has a token
      Bytes nonce = hello.bytes();
      hello.expect_end();
      if (version != wire::kHandshakeVersion) return fail(str("handshake version ", version));
      wire::Writer w;
      w.u8(wire::kHandshakeVersion).bytes(comm::auth::proof(f_.opts.token, nonce));
      exchange(w.finish(), wire::kMaxHandshakeBody, [this](wire::Reader& verdict) {
        if (verdict.u8() != static_cast<uint8_t>(Status::kOk)) return fail(verdict.str());
        verdict.expect_end();
        call(
            Op::kPing, [](wire::Writer&) {},
            [this](wire::Reader& r) {
              r.expect_end();
              connected_at_ = Clock::now();
              f_.note_connected();
              on_connected();
            });
      });
    });
  }

  void exchange(Bytes frame, size_t max, Then then) {
    out_ = std::move(frame);
    asio::async_write(sock_, asio::buffer(out_),
                      [this, max, then = std::move(then)](boost::system::error_code ec, size_t) {
                        if (ec) return fail("write: " + ec.message());
                        read_frame(max, std::move(then));
                      });
  }

  void read_frame(size_t max, Then then) {
    asio::async_read(sock_, asio::buffer(len_),
                     [this, max, then = std::move(then)](boost::system::error_code ec, size_t) {
                       if (ec) return fail("read: " + ec.message());
                       uint32_t len = wire::decode_length(len_.data());
                       if (len < 1 || len > max) return fail(str("reply length ", len));
                       in_.resize(len);
                       asio::async_read(
                           sock_, asio::buffer(in_),
                           [this, then = std::move(then)](boost::system::error_code ec, size_t) {
                             if (ec) return fail("read: " + ec.message());
                             try {
                               wire::Reader r(in_.data(), in_.size());
                               then(r);
                             } catch (const std::exception& e) {
                               fail(e.what());
                             }
                           });
                     });
  }

  tcp::socket sock_;
  asio::steady_timer backoff_timer_;
  comm::Millis backoff_{kFirstBackoff};
  std::array<uint8_t, wire::kLengthBytes> len_{};
  Bytes in_, out_;
  uint64_t next_id_ = 1;
  Clock::time_point started_{}, connected_at_{};
};

// A value the size of a typical rendezvous entry (an address, a small id), unique per client
// so that reading the wrong key shows.
Bytes value_of(int client) {
  std::string v = "client-" + std::to_string(client) + "@127.0.0.1:29500";
  v.resize(32, '.');
  return Bytes(v.begin(), v.end());
}

constexpr const char* kCounter = "rdzv/arrived";
constexpr const char* kBarrier = "rdzv/all-arrived";
std::string addr_key(int client) { return "rdzv/addr/" + std::to_string(client); }

// A worker's bootstrap: publish, count in, wait for everyone, read a peer, leave.
class RendezvousClient : public Client {
 public:
  RendezvousClient(Fleet& f, int index, int world) : Client(f, index), world_(world) {}
  Clock::time_point done_at() const { return done_at_; }
  Clock::time_point barrier_at() const { return barrier_at_; }

 private:
  void on_connected() override {
    const int64_t t = f_.opts.timeout.count();
    call(
        Op::kSet, [&](wire::Writer& w) { w.str(addr_key(index_)).bytes(value_of(index_)).i64(0); },
        [this, t](wire::Reader&) {
          call(
              Op::kAdd, [](wire::Writer& w) { w.str(kCounter).i64(1); },
              [this, t](wire::Reader& r) {
                if (r.i64() != world_) return wait(t);
                // The last to arrive opens the barrier for all.
                call(
                    Op::kSet, [](wire::Writer& w) { w.str(kBarrier).bytes(Bytes{'1'}).i64(0); },
                    [this, t](wire::Reader&) {
                      barrier_at_ = Clock::now();
                      wait(t);
                    });
              });
        });
  }
  void wait(int64_t t) {
    call(
        Op::kWait, [&](wire::Writer& w) { w.strings({kBarrier}).i64(t); },
        [this, t](wire::Reader&) {
          const int peer = (index_ + 1) % world_;
          call(
              Op::kGet, [&](wire::Writer& w) { w.str(addr_key(peer)).i64(t); },
              [this, peer](wire::Reader& r) {
                if (r.bytes() != value_of(peer)) return fail("read a wrong value for its peer");
                done_at_ = Clock::now();
                disconnect();
                f_.end_one(world_);
              });
        });
  }

  const int world_;
  Clock::time_point done_at_{}, barrier_at_{};
};

// For run_load: clients run phases (one op each) in lockstep; the last client to finish a
// phase starts the next.
struct LoadPlan {
  std::vector<Op> ops = {Op::kSet, Op::kGet, Op::kAdd};
  double seconds = 1;
  int clients = 0;
  std::atomic<int> ready{0}, phase_done{0};
  size_t phase = 0;  // written only between phases (every client idle)
  Clock::time_point phase_start, phase_end;
  std::vector<double> phase_wall;
};

class LoadClient : public Client {
 public:
  LoadClient(Fleet& f, int index, LoadPlan& plan, std::vector<std::unique_ptr<LoadClient>>& all)
      : Client(f, index), plan_(plan), all_(all), lat_(plan.ops.size()) {}
  std::vector<float>& latencies(size_t phase) { return lat_[phase]; }
  int64_t max_count() const { return max_count_; }

  void next_op() {
    auto t0 = Clock::now();
    if (t0 >= plan_.phase_end) return phase_finished();
    const Op op = plan_.ops[plan_.phase];
    const std::string key = "bench/" + std::to_string(index_);
    Args args;
    if (op == Op::kSet)
      args = [&](wire::Writer& w) { w.str(key).bytes(value_of(index_)).i64(0); };
    else if (op == Op::kGet)
      args = [&](wire::Writer& w) { w.str(key).i64(f_.opts.timeout.count()); };
    else  // one shared counter: the contended case (barriers)
      args = [](wire::Writer& w) { w.str("bench/counter").i64(1); };
    call(op, args, [this, t0, op](wire::Reader& r) {
      auto t1 = Clock::now();
      if (op == Op::kAdd) max_count_ = std::max(max_count_, r.i64());
      lat_[plan_.phase].push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
      next_op();
    });
  }

 private:
  void on_connected() override {
    call(
        Op::kSet,
        [&](wire::Writer& w) {
          w.str("bench/" + std::to_string(index_)).bytes(value_of(index_)).i64(0);
        },
        [this](wire::Reader&) {
          if (++plan_.ready == plan_.clients) start_phase(0);
        });
  }
  void phase_finished() {
    if (++plan_.phase_done < plan_.clients) return;
    plan_.phase_wall.push_back(seconds_since(plan_.phase_start, Clock::now()));
    if (plan_.phase + 1 == plan_.ops.size()) return f_.io.stop();
    start_phase(plan_.phase + 1);
  }
  // Every client is idle here (all finished the phase, or all just connected).
  void start_phase(size_t p) {
    plan_.phase = p;
    plan_.phase_done = 0;
    plan_.phase_start = Clock::now();
    plan_.phase_end = plan_.phase_start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(plan_.seconds));
    for (auto& c : all_) asio::post(f_.io, [c = c.get()] { c->next_op(); });
  }

  LoadPlan& plan_;
  std::vector<std::unique_ptr<LoadClient>>& all_;
  std::vector<std::vector<float>> lat_;  // per phase, microseconds
  int64_t max_count_ = 0;
};

}  // namespace

RendezvousResult run_rendezvous(const FleetOptions& o, int clients) {
  Fleet f(o);
  std::vector<std::unique_ptr<RendezvousClient>> all;
  all.reserve(size_t(clients));
  for (int i = 0; i < clients; ++i)
    all.push_back(std::make_unique<RendezvousClient>(f, i, clients));
  for (auto& c : all) c->connect();
  f.run();

  RendezvousResult r;
  r.clients = clients;
  r.peak_connected = f.peak;
  r.connect_retries = f.retries;
  r.error = f.first_error();
  Clock::time_point t0 = Clock::time_point::max(), connected{}, barrier{}, done{};
  std::vector<float> connect_ms;
  for (const auto& c : all) {
    t0 = std::min(t0, c->started());
    if (c->connected_at() != Clock::time_point{}) {
      connected = std::max(connected, c->connected_at());
      connect_ms.push_back(
          std::chrono::duration<float, std::milli>(c->connected_at() - c->started()).count());
    }
    barrier = std::max(barrier, c->barrier_at());
    if (c->done_at() != Clock::time_point{}) {
      ++r.completed;
      done = std::max(done, c->done_at());
    }
  }
  if (int(connect_ms.size()) == clients) r.all_connected_s = seconds_since(t0, connected);
  if (barrier != Clock::time_point{}) r.barrier_s = seconds_since(t0, barrier);
  if (r.completed == clients) r.wall_s = seconds_since(t0, done);
  r.connect_p50_ms = percentile(connect_ms, 0.50);
  r.connect_p99_ms = percentile(connect_ms, 0.99);
  r.connect_max_ms =
      connect_ms.empty() ? 0 : *std::max_element(connect_ms.begin(), connect_ms.end());
  return r;
}

std::vector<StoreSample> run_load(const FleetOptions& o, int clients, double seconds) {
  Fleet f(o);
  LoadPlan plan;
  plan.seconds = seconds;
  plan.clients = clients;
  std::vector<std::unique_ptr<LoadClient>> all;
  all.reserve(size_t(clients));
  for (int i = 0; i < clients; ++i) all.push_back(std::make_unique<LoadClient>(f, i, plan, all));
  for (auto& c : all) c->connect();
  f.run();
  std::string error = f.first_error();
  if (error.empty() && plan.phase_wall.size() != plan.ops.size())
    error = "stopped before every op ran";
  if (!error.empty())
    throw CommError("bench store load, " + std::to_string(clients) + " clients: " + error);

  std::vector<StoreSample> out;
  for (size_t p = 0; p < plan.ops.size(); ++p) {
    std::vector<float> lat;
    int64_t counted = 0;
    for (auto& c : all) {
      lat.insert(lat.end(), c->latencies(p).begin(), c->latencies(p).end());
      counted = std::max(counted, c->max_count());
    }
    if (plan.ops[p] == Op::kAdd)
      WEFT_ENSURE(counted == int64_t(lat.size()), CommError, "bench store: counter reads ", counted,
                  " after ", lat.size(), " adds");
    StoreSample s{clients, wire::op_name(plan.ops[p]), 0, 0,
                  double(lat.size()) / plan.phase_wall[p]};
    s.p50_us = percentile(lat, 0.50);
    s.p99_us = percentile(lat, 0.99);
    out.push_back(s);
  }
  return out;
}

}  // namespace weft::launch
