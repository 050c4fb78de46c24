// The store's job token and network exposure, over real sockets and processes: who gets in
// (the right token), who does not (none, a wrong one, no handshake at all) and reads nothing,
// that the token never crosses the wire, and that the listening socket is not inherited.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <dirent.h>
#include <string>
#include <thread>

#include "base/error.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store.h"
#include "comm/store/tcp_store_server.h"
#include "tests/comm/store_raw_client.h"

namespace weft::test {
namespace {

using namespace std::chrono_literals;
using comm::Bytes;
using comm::TCPStore;
using comm::TCPStoreOptions;
using comm::TCPStoreServer;
using comm::TCPStoreServerOptions;
using comm::wire::Op;
using Handshake = RawClient::Handshake;

const std::string kToken = "tok-3f9c2a7e51d04b8c9e6f0a1b2c3d4e5f";
const std::string kSecret = "the-secret-value-7c1d";

TCPStoreServerOptions with_token(const std::string& token) {
  TCPStoreServerOptions o;
  o.token = token;
  return o;
}

TCPStoreOptions client_opts(uint16_t port, const std::string& token, comm::Millis t = 10s) {
  TCPStoreOptions o;
  o.port = port;
  o.token = token;
  o.timeout = t;
  return o;
}

bool contains(const Bytes& hay, const std::string& needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "(no CommError)";
}

// After a refused handshake: asks for the secret anyway and collects all the server sends
// until it closes. The connection must close and the value must not be in it.
void expect_nothing_readable(RawClient& raw) {
  raw.send(request(9, Op::kGet).str("job/secret").i64(1000).finish());
  raw.send(request(10, Op::kNumKeys).str("").finish());
  Bytes got;
  EXPECT_TRUE(raw.closed_by_peer(&got)) << "the connection stayed open";
  EXPECT_FALSE(contains(got, kSecret));
}

TEST(StoreAuth, TheRightTokenWorks) {
  TCPStoreServer server(with_token(kToken));
  TCPStore a(client_opts(server.port(), kToken));
  TCPStore b(client_opts(server.port(), kToken));
  a.set_string("job/secret", kSecret);
  EXPECT_EQ(b.get_string("job/secret"), kSecret);
  EXPECT_EQ(b.add("n", 2), 2);
  EXPECT_EQ(server.stats().refused_auth, 0u);

  // What the handshake costs a connect (printed, not asserted: timing is not a contract).
  TCPStoreServer open_server;
  auto mean_us = [](uint16_t port, const std::string& token) {
    constexpr int kConnects = 200;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kConnects; ++i) TCPStore c(client_opts(port, token));
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
               .count() /
           kConnects;
  };
  double with = mean_us(server.port(), kToken), without = mean_us(open_server.port(), "");
  std::printf("[ measured ] connect + ping: %.0f us with the token handshake, %.0f us without\n",
              with, without);
}

TEST(StoreAuth, AClientWithoutTheTokenIsRefusedAndReadsNothing) {
  TCPStoreServer server(with_token(kToken));
  TCPStore good(client_opts(server.port(), kToken));
  good.set_string("job/secret", kSecret);

  std::string msg = message_of([&] { TCPStore(client_opts(server.port(), "", 2s)); });
  EXPECT_NE(msg.find("WEFT_JOB_TOKEN"), std::string::npos) << msg;
  EXPECT_NE(msg.find("requires the job token"), std::string::npos) << msg;

  RawClient raw(server.port(), Handshake::kSkip);
  EXPECT_FALSE(raw.handshake(""));  // an empty proof
  EXPECT_NE(raw.refusal().find("requires the job token"), std::string::npos) << raw.refusal();
  expect_nothing_readable(raw);

  // No handshake at all: requests straight away are not a proof.
  RawClient rude(server.port(), Handshake::kSkip);
  ASSERT_TRUE(rude.recv_frame());
  expect_nothing_readable(rude);

  EXPECT_GE(server.stats().refused_auth + server.stats().dropped_malformed, 2u);
  EXPECT_EQ(good.get_string("job/secret"), kSecret) << "the job's own client is unaffected";
}

TEST(StoreAuth, AWrongTokenIsRefusedAndReadsNothing) {
  TCPStoreServer server(with_token(kToken));
  TCPStore good(client_opts(server.port(), kToken));
  good.set_string("job/secret", kSecret);

  std::string msg = message_of([&] { TCPStore(client_opts(server.port(), kToken + "x", 2s)); });
  EXPECT_NE(msg.find("wrong job token"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WEFT_JOB_TOKEN"), std::string::npos) << msg;

  RawClient raw(server.port(), Handshake::kSkip);
  EXPECT_FALSE(raw.handshake("not-the-token"));
  EXPECT_NE(raw.refusal().find("wrong job token"), std::string::npos) << raw.refusal();
  expect_nothing_readable(raw);

  // A proof made for another connection's nonce (a replay) is wrong here too.
  RawClient first(server.port(), Handshake::kDo, kToken);
  RawClient replay(server.port(), Handshake::kSkip);
  ASSERT_TRUE(replay.recv_frame());
  comm::wire::Writer w;
  w.u8(comm::wire::kHandshakeVersion).bytes(comm::auth::proof(kToken, first.nonce()));
  ASSERT_TRUE(replay.send(w.finish()));
  auto verdict = replay.recv_frame();
  ASSERT_TRUE(verdict);
  EXPECT_NE((*verdict)[0], 0) << "a replayed proof was accepted";
  expect_nothing_readable(replay);

  EXPECT_EQ(server.stats().refused_auth, 3u);
  EXPECT_EQ(good.get_string("job/secret"), kSecret);
}

// A man in the middle on 127.0.0.1 that relays one connection both ways and records it.
class RecordingProxy {
 public:
  explicit RecordingProxy(uint16_t target) : target_(target) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_, 4) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("proxy: cannot listen");
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~RecordingProxy() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(listen_);
  }
  uint16_t port() const { return port_; }
  // Everything relayed, both directions, once the client has gone.
  Bytes traffic() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return seen_;
  }

 private:
  void run() {
    pollfd pl{listen_, POLLIN, 0};
    if (::poll(&pl, 1, 10'000) <= 0) return;
    int c = ::accept(listen_, nullptr, nullptr);
    int u = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(target_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (c < 0 || ::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    uint8_t buf[4096];
    while (!stop_) {
      pollfd p[2] = {{c, POLLIN, 0}, {u, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          done = true;
          break;
        }
        seen_.insert(seen_.end(), buf, buf + n);
        ::send(i == 0 ? u : c, buf, size_t(n), MSG_NOSIGNAL);
      }
      if (done) break;
    }
    ::close(c);
    ::close(u);
  }
  int listen_ = -1;
  uint16_t target_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Bytes seen_;
};

TEST(StoreAuth, TheTokenNeverCrossesTheWire) {
  TCPStoreServer server(with_token(kToken));
  RecordingProxy proxy(server.port());
  {
    TCPStore via(client_opts(proxy.port(), kToken));
    via.set_string("job/secret", kSecret);
    EXPECT_EQ(via.get_string("job/secret"), kSecret);
  }
  Bytes seen = proxy.traffic();
  ASSERT_TRUE(contains(seen, kSecret)) << "the proxy recorded the session";
  EXPECT_FALSE(contains(seen, kToken)) << "the token was sent in the clear";
  EXPECT_FALSE(contains(seen, kToken.substr(0, 8))) << "part of the token was sent";
}

TEST(StoreAuth, WithoutATokenOnlyLoopbackIsServed) {
  EXPECT_THROW(TCPStoreServer(TCPStoreServerOptions{.host = "0.0.0.0"}), ConfigError);
  TCPStoreServer open_to_all(TCPStoreServerOptions{.host = "0.0.0.0", .insecure = true});
  TCPStore c("127.0.0.1", open_to_all.port(), 10s);
  c.set_string("k", "v");
  // A client with a token may use a store without one (a local store in a tokened job).
  TCPStoreServer local;
  TCPStore tokened(client_opts(local.port(), kToken));
  tokened.set_string("k", "v");
  EXPECT_EQ(tokened.get_string("k"), "v");
}

// The socket of `fd`'s local port, or -1; `listening` picks the listener or a connection.
int find_socket(uint16_t port, bool listening) {
  int found = -1;
  DIR* dir = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = std::atoi(e->d_name);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    int acc = 0;
    socklen_t acc_len = sizeof acc;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET)
      continue;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &acc_len) != 0) continue;
    if (ntohs(a.sin_port) == port && bool(acc) == listening) found = fd;
  }
  ::closedir(dir);
  return found;
}

TEST(StoreAuth, SocketsAreCloseOnExec) {
  TCPStoreServer server;
  TCPStore client("127.0.0.1", server.port(), 10s);
  client.set_string("k", "v");
  int listener = find_socket(server.port(), true);
  ASSERT_GE(listener, 0);
  EXPECT_TRUE(::fcntl(listener, F_GETFD) & FD_CLOEXEC) << "the listening socket is inherited";
  int accepted = find_socket(server.port(), false);  // the server's end of the connection
  ASSERT_GE(accepted, 0);
  EXPECT_TRUE(::fcntl(accepted, F_GETFD) & FD_CLOEXEC);
}

// The agent's story: a store host spawns a long-lived worker and dies; the worker must not
// have inherited the listener (or any socket), so the port is free for the next store.
TEST(StoreAuth, AWorkerOfAStoreHostThatDiedHoldsNoSocket) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t host = ::fork();
  ASSERT_GE(host, 0);
  if (host == 0) {
    ::close(pipefd[0]);
    int32_t msg[2] = {0, 0};
    try {
      TCPStoreServer server;
      pid_t worker = ::fork();
      if (worker == 0) {
        ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      msg[0] = server.port();
      msg[1] = worker;
      (void)!::write(pipefd[1], msg, sizeof msg);
    } catch (...) {
    }
    ::_exit(0);
  }
  ::close(pipefd[1]);
  int32_t msg[2] = {0, 0};
  ASSERT_EQ(::read(pipefd[0], msg, sizeof msg), ssize_t(sizeof msg));
  ::close(pipefd[0]);
  ::waitpid(host, nullptr, 0);
  ASSERT_EQ(::kill(msg[1], 0), 0) << "the worker should still be alive";
  // Close-on-exec acts at exec: until the worker has become `sleep` it still holds every
  // descriptor of its parent, so wait for the exec before testing the port.
  std::string comm;
  for (int i = 0; i < 500 && comm != "sleep"; ++i) {
    std::ifstream in("/proc/" + std::to_string(msg[1]) + "/comm");
    std::getline(in, comm);
    if (comm != "sleep") ::usleep(10'000);
  }
  ASSERT_EQ(comm, "sleep") << "the worker never exec'd";
  // The worker holds no socket at all, so nothing of it keeps the port. (Binding the port
  // again would test the same, but under a parallel test run any other process may take
  // the freed port as its ephemeral one first.)
  std::vector<std::string> sockets;
  const std::string fds = "/proc/" + std::to_string(msg[1]) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(fds)) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:", 0) == 0) sockets.push_back(e.path().string() + " -> " + target);
  }
  EXPECT_TRUE(sockets.empty()) << "the worker inherited " << sockets.size() << " socket(s), e.g. "
                               << (sockets.empty() ? "" : sockets[0]);
  ::kill(msg[1], SIGKILL);
}

// --- `weft store` on the network ---------------------------------------------------------

struct Launched {
  pid_t pid = -1;
  std::string out, err;
  int status = 0;
};

// Runs `weft store ARGS` with WEFT_JOB_TOKEN = `token` ("" unset). When `wait_exit`, waits
// for it and collects stderr; else returns once it printed its listening line.
Launched launch_store(std::vector<std::string> args, const std::string& token, bool wait_exit) {
  int out[2], err[2];
  Launched l;
  if (::pipe(out) != 0 || ::pipe(err) != 0) return l;
  l.pid = ::fork();
  if (l.pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    // Not waited for: nobody reads its stderr later, so the shutdown line must not SIGPIPE it.
    if (!wait_exit) ::dup2(::open("/dev/null", O_WRONLY), err[1]);
    ::dup2(err[1], STDERR_FILENO);
    ::close(out[0]);
    ::close(err[0]);
    if (token.empty())
      ::unsetenv("WEFT_JOB_TOKEN");
    else
      ::setenv("WEFT_JOB_TOKEN", token.c_str(), 1);
    ::unsetenv("WEFT_JOB_TOKEN_FILE");
    std::vector<char*> argv = {const_cast<char*>(WEFT_BINARY), const_cast<char*>("store")};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(WEFT_BINARY, argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  char c;
  if (wait_exit) {
    while (::read(err[0], &c, 1) == 1) l.err += c;
    ::waitpid(l.pid, &l.status, 0);
  } else {
    while (l.out.find('\n') == std::string::npos && ::read(out[0], &c, 1) == 1) l.out += c;
  }
  ::close(out[0]);
  ::close(err[0]);
  return l;
}

TEST(WeftStoreCommand, EveryInterfaceWithoutATokenIsBadInput) {
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with every test binary";
  Launched l = launch_store({"--port", "0", "--host", "0.0.0.0"}, "", true);
  ASSERT_TRUE(WIFEXITED(l.status)) << l.status;
  EXPECT_EQ(WEXITSTATUS(l.status), 2) << l.err;
  EXPECT_NE(l.err.find("--host"), std::string::npos) << l.err;
  EXPECT_NE(l.err.find("WEFT_JOB_TOKEN"), std::string::npos) << l.err;
}

TEST(WeftStoreCommand, EveryInterfaceWithATokenServesOnlyTokenHolders) {
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with every test binary";
  Launched l = launch_store({"--port", "0", "--host", "0.0.0.0"}, kToken, false);
  const std::string prefix = "weft store: listening on 0.0.0.0:";
  ASSERT_EQ(l.out.rfind(prefix, 0), 0u) << l.out;
  uint16_t port = uint16_t(std::stoi(l.out.substr(prefix.size())));
  {
    TCPStore good(client_opts(port, kToken));
    good.set_string("job/secret", kSecret);
    EXPECT_THROW(TCPStore(client_opts(port, "", 2s)), CommError);
  }
  ::kill(l.pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(l.pid, &status, 0), l.pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(WeftStoreCommand, DefaultsToLoopback) {
  ASSERT_EQ(::access(WEFT_BINARY, X_OK), 0) << WEFT_BINARY << " is built with every test binary";
  Launched l = launch_store({"--port", "0"}, "", false);
  EXPECT_EQ(l.out.rfind("weft store: listening on 127.0.0.1:", 0), 0u) << l.out;
  ::kill(l.pid, SIGTERM);
  ::waitpid(l.pid, nullptr, 0);
}

}  // namespace
}  // namespace weft::test
