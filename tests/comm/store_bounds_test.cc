// The store's bounds, over real sockets: a frame header cannot make the server allocate what
// it announces (measured as the RSS of a server in its own process), stalled frames and idle
// connections time out, and the total memory cap refuses writes without closing the writer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/comm/store_raw_client.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using comm::Bytes;
using comm::TCPStore;
using comm::TCPStoreServer;
using comm::TCPStoreServerOptions;
using comm::wire::Op;

long vm_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

Bytes header(uint32_t len) {
  return Bytes{uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
}

// A TCPStoreServer (default limits) in a child process that reports its VmRSS and stats
// whenever asked: the parent's own allocations cannot blur the measurement.
class ServerProcess {
 public:
  ServerProcess() {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(down[1]);
      ::close(up[0]);
      TCPStoreServer server;
      int64_t msg[3] = {server.port(), 0, 0};
      (void)!::write(up[1], msg, sizeof msg);
      char c;
      while (::read(down[0], &c, 1) == 1) {
        auto s = server.stats();
        int64_t r[3] = {vm_rss_kib(), int64_t(s.dropped_malformed), int64_t(s.bytes_held_peak)};
        (void)!::write(up[1], r, sizeof r);
      }
      ::_exit(0);
    }
    ::close(down[0]);
    ::close(up[1]);
    to_ = down[1];
    from_ = up[0];
    int64_t msg[3];
    if (::read(from_, msg, sizeof msg) != sizeof msg) throw std::runtime_error("no port");
    port_ = uint16_t(msg[0]);
  }
  ~ServerProcess() {
    ::close(to_);
    ::close(from_);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  uint16_t port() const { return port_; }
  // {VmRSS KiB, dropped_malformed, bytes_held_peak}
  std::array<int64_t, 3> probe() {
    std::array<int64_t, 3> r{};
    (void)!::write(to_, "?", 1);
    if (::read(from_, r.data(), sizeof r) != ssize_t(sizeof r)) r[0] = -1;
    return r;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  uint16_t port_ = 0;
};

TEST(StoreBounds, AnnouncedFrameSizesAreNotAllocated) {
  ServerProcess server;
  {  // warm up: one ordinary client, so the baseline includes a served connection
    TCPStore c("127.0.0.1", server.port(), 10s);
    c.set_string("k", "v");
  }
  long before = server.probe()[0];
  ASSERT_GT(before, 0);

  // 256 MiB announced: over the maximum frame, refused on the header alone.
  RawClient huge(server.port());
  ASSERT_TRUE(huge.send(header(256u << 20)));
  EXPECT_TRUE(huge.closed_by_peer());
  EXPECT_EQ(server.probe()[1], 1) << "counted as malformed";

  // 60 MiB announced by each of 8 clients (within the maximum frame), then 1 KiB and a stall:
  // the server must hold about what arrived, not 480 MiB.
  std::vector<std::unique_ptr<RawClient>> stalled;
  for (int i = 0; i < 8; ++i) {
    stalled.push_back(std::make_unique<RawClient>(server.port()));
    Bytes f = header(60u << 20);
    Bytes start = request(1, Op::kSet).str("big").finish();  // a plausible frame start
    f.insert(f.end(), start.begin() + 4, start.end());
    f.resize(f.size() + 1024, 7);
    ASSERT_TRUE(stalled.back()->send(f));
  }
  std::this_thread::sleep_for(200ms);
  auto after = server.probe();
  long grew_kib = after[0] - before;
  std::printf("[ measured ] server VmRSS %ld KiB before, %ld KiB after a 256 MiB header and "
              "8 stalled 60 MiB frames (+%ld KiB); bytes_held_peak %lld\n",
              before, long(after[0]), grew_kib, (long long)after[2]);
  EXPECT_LT(grew_kib, 16 * 1024) << "the server allocated what the headers announced";
  EXPECT_LT(after[2], 16 << 20);
}

TEST(StoreBounds, AStalledHalfFrameIsDroppedAfterTheReadTimeout) {
  TCPStoreServerOptions o;
  o.read_timeout = 300ms;
  TCPStoreServer server(o);
  TCPStore good("127.0.0.1", server.port(), 10s);

  // Half a header; half a body; and a client that never does the handshake.
  RawClient half_header(server.port());
  ASSERT_TRUE(half_header.send(Bytes{40, 0}));
  RawClient half_body(server.port());
  Bytes f = request(1, Op::kSet).str("k").bytes(Bytes(1000, 1)).i64(0).finish();
  f.resize(f.size() / 2);
  ASSERT_TRUE(half_body.send(f));
  RawClient silent(server.port(), RawClient::Handshake::kSkip);

  auto t0 = Clock::now();
  EXPECT_TRUE(half_header.closed_by_peer());
  EXPECT_TRUE(half_body.closed_by_peer());
  EXPECT_TRUE(silent.closed_by_peer());
  auto waited = Clock::now() - t0;
  EXPECT_GE(waited, 250ms) << "dropped before the timeout";
  EXPECT_LT(waited, 10s);
  EXPECT_EQ(server.stats().dropped_timeout, 3u);

  // An ordinary client, idle between requests for longer than the read timeout, stays.
  std::this_thread::sleep_for(500ms);
  good.set_string("k", "v");
  EXPECT_EQ(good.get_string("k"), "v");
}

// The read deadline is moved lazily (the timer sleeps while a connection is idle): a frame
// that starts after an idle spell longer than the read timeout is still timed.
TEST(StoreBounds, AHalfFrameAfterALongIdleSpellIsStillDropped) {
  TCPStoreServerOptions o;
  o.read_timeout = 200ms;
  TCPStoreServer server(o);
  RawClient c(server.port());
  ASSERT_TRUE(c.send(request(1, Op::kPing).finish()));
  ASSERT_TRUE(c.recv_frame());
  std::this_thread::sleep_for(600ms);  // past the read timeout, idle: the connection stays
  EXPECT_EQ(server.stats().dropped_timeout, 0u);
  ASSERT_TRUE(c.send(Bytes{40, 0}));  // half a header, then nothing
  EXPECT_TRUE(c.closed_by_peer()) << "a stalled frame was never timed out";
  EXPECT_EQ(server.stats().dropped_timeout, 1u);
}

TEST(StoreBounds, IdleTimeoutClosesOnlyIdleConnections) {
  TCPStoreServerOptions o;
  o.idle_timeout = 300ms;
  TCPStoreServer server(o);
  RawClient idle(server.port());
  RawClient waiting(server.port());
  ASSERT_TRUE(waiting.send(request(1, Op::kWait).strings({"later"}).i64(1500).finish()));
  EXPECT_TRUE(idle.closed_by_peer());
  // The parked wait keeps its connection past the idle timeout and gets its answer.
  auto reply = waiting.recv_frame();
  ASSERT_TRUE(reply) << "the waiting client was closed as idle";
  EXPECT_EQ((*reply)[8], uint8_t(comm::wire::Status::kTimeout));
}

TEST(StoreBounds, TheTotalCapRefusesWritesAndKeepsTheConnection) {
  TCPStoreServerOptions o;
  o.max_total_bytes = 1 << 20;
  o.max_value_bytes = 256 << 10;
  TCPStoreServer server(o);
  TCPStore c("127.0.0.1", server.port(), 10s);
  int stored = 0;
  std::string why;
  for (; stored < 16; ++stored) {
    try {
      c.set("v" + std::to_string(stored), Bytes(200 << 10, 1));
    } catch (const CommError& e) {
      why = e.what();
      break;
    }
  }
  EXPECT_GE(stored, 3);
  EXPECT_LT(stored, 6);
  EXPECT_NE(why.find("max_total_bytes"), std::string::npos) << why;
  EXPECT_EQ(c.get("v0").size(), size_t(200 << 10)) << "the writer's connection stays usable";
  EXPECT_LE(server.stats().bytes_held_peak, uint64_t(1 << 20) + (512 << 10));
  EXPECT_TRUE(c.erase("v0"));
  c.set("again", Bytes(200 << 10, 2));  // room again after an erase
}

}  // namespace
}  // namespace weft::test
