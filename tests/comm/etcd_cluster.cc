// EtcdCluster: fork/exec of /usr/bin/etcd per member, readiness by a linearizable read
// through EtcdStore itself, SIGKILL + waitpid on the way out.
#include "tests/comm/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "base/error.h"
#include "comm/store/etcd_http.h"
#include "comm/store/etcd_store.h"

namespace weft::test {

namespace {
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kReadyWithin = 20s;
constexpr int kStartAttempts = 3;  // a free port taken by someone else before etcd binds it

std::string url(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

// Free loopback ports, `n` at once: the sockets stay bound until all are chosen, so the
// kernel cannot hand out one port twice.
std::vector<uint16_t> free_ports(int n) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("EtcdCluster: no free port");
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

// The data directory, "weft-etcd-<test pid>-XXXXXX". Directories that a killed test
// binary left behind (its members die with it, the directory does not) are removed here,
// known by their pid being gone: tmpfs is memory.
std::string temp_root() {
  // tmpfs when there is one: etcd fsyncs every write, which is free there.
  std::string base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "";
  if (base.empty()) base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("weft-etcd-")) continue;
    const pid_t owner = std::atoi(name.c_str() + 10);
    if (owner > 0 && ::kill(owner, 0) != 0 && errno == ESRCH)
      std::filesystem::remove_all(e.path(), ec);
  }
  std::string tmpl = base + "/weft-etcd-" + std::to_string(::getpid()) + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("EtcdCluster: mkdtemp failed");
  return tmpl;
}

void reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}
}  // namespace

bool etcd_available() { return ::access(kEtcdBinary, X_OK) == 0; }

EtcdCluster::EtcdCluster(int members) {
  std::string last_error;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    try {
      root_ = temp_root();
      std::vector<uint16_t> ports = free_ports(2 * members);
      members_.assign(members, Member{});
      std::string initial_cluster;
      for (int i = 0; i < members; ++i) {
        Member& m = members_[i];
        m.name = std::string("m") + std::to_string(i);
        m.dir = root_ + "/" + m.name;
        m.log = root_ + "/" + m.name + ".log";
        m.client_port = ports[2 * i];
        m.peer_port = ports[2 * i + 1];
        initial_cluster += (i ? "," : "") + m.name + "=" + url(m.peer_port);
      }
      // Members wait for each other (quorum) before serving: start all, then wait.
      for (int i = 0; i < members; ++i) start(i, initial_cluster);
      for (int i = 0; i < members; ++i) wait_ready(i);
      return;
    } catch (const std::exception& e) {
      last_error = e.what();
      stop_all();
    }
  }
  throw std::runtime_error("EtcdCluster: " + std::to_string(members) + " member(s) did not start " +
                           std::to_string(kStartAttempts) + " times; last: " + last_error);
}

EtcdCluster::~EtcdCluster() { stop_all(); }

void EtcdCluster::stop_all() noexcept {
  for (auto& m : members_)
    if (m.pid > 0) {
      reap(m.pid);
      m.pid = -1;
    }
  if (!root_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
    root_.clear();
  }
}

void EtcdCluster::start(int i, const std::string& initial_cluster) {
  Member& m = members_[i];
  // One flag and its value per line.
  // clang-format off
  std::vector<std::string> args = {
      kEtcdBinary,
      "--name", m.name,
      "--data-dir", m.dir,
      "--listen-client-urls", url(m.client_port),
      "--advertise-client-urls", url(m.client_port),
      "--listen-peer-urls", url(m.peer_port),
      "--initial-advertise-peer-urls", url(m.peer_port),
      "--initial-cluster", initial_cluster,
      "--initial-cluster-state", "new",
      "--initial-cluster-token", "weft-test-" + std::to_string(::getpid()),
      "--heartbeat-interval", "25",
      "--election-timeout", "250"};
  // clang-format on
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("EtcdCluster: fork failed");
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    int log = ::open(m.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) {
      ::dup2(log, 1);
      ::dup2(log, 2);
    }
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  m.pid = pid;
}

void EtcdCluster::wait_ready(int i) {
  Member& m = members_[i];
  comm::EtcdStoreOptions o;
  o.endpoints = {endpoint(i)};
  o.request_timeout = 500ms;
  o.failover_timeout = 500ms;
  comm::EtcdStore probe(o);
  const auto deadline = Clock::now() + kReadyWithin;
  for (;;) {
    int status = 0;
    if (::waitpid(m.pid, &status, WNOHANG) == m.pid) {
      m.pid = -1;
      throw std::runtime_error("etcd member " + m.name + " exited (status " +
                               std::to_string(status) + "): " + log_tail(i));
    }
    try {
      probe.ping();
      return;
    } catch (const CommError& e) {
      if (Clock::now() > deadline)
        throw std::runtime_error("etcd member " + m.name + " not serving after 20 s (" + e.what() +
                                 "): " + log_tail(i));
    }
    std::this_thread::sleep_for(20ms);
  }
}

std::string EtcdCluster::endpoint(int i) const {
  return "127.0.0.1:" + std::to_string(members_[i].client_port);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

void EtcdCluster::kill(int i) {
  if (members_[i].pid > 0) reap(members_[i].pid);
  members_[i].pid = -1;
}

int EtcdCluster::leader() const {
  for (int i = 0; i < size(); ++i) {
    if (!running(i)) continue;
    try {
      comm::EtcdHttp http({comm::parse_etcd_endpoint(endpoint(i), "test")}, 1s, 1s);
      auto r = http.post("/v3/maintenance/status", nlohmann::json::object(), comm::Replay::kSafe);
      if (r.value("leader", "") != "" &&
          r.value("leader", "") == r["header"].value("member_id", ""))
        return i;
    } catch (const CommError&) {
    }
  }
  return -1;
}

std::string EtcdCluster::log_tail(int i) const {
  std::ifstream in(members_[i].log);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  constexpr size_t kTail = 1500;
  return s.size() > kTail ? "..." + s.substr(s.size() - kTail) : s;
}

}  // namespace weft::test
