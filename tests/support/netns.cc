// VirtualHosts (netns.h): namespaces, veths and bridges made with iproute2's `ip`; processes
// entered into a host with setns() between fork and exec, so the test keeps their real pids.
#include "tests/support/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

namespace weft::test {
namespace {

namespace fs = std::filesystem;
const std::string kOwnerPrefix = "weft-vh-";  // + "<pid>-<n>-h<i>" or "<pid>-<n>-sw"

struct IpResult {
  int code = -1;
  std::string out;
};

// `PROG ARGS...` (iproute2's ip or tc) without a shell; stdout and stderr together.
IpResult run_tool(const char* prog, const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {-1, std::string("pipe: ") + std::strerror(errno)};
  std::vector<char*> argv{const_cast<char*>(prog)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execvp(prog, argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  IpResult r;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    r.out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  if (pid > 0)
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  r.code = pid < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

IpResult run_ip(const std::vector<std::string>& args) { return run_tool("ip", args); }

std::string joined(const std::vector<std::string>& args, const char* prog = "ip") {
  std::string s = prog;
  for (const std::string& a : args) s += " " + a;
  return s;
}

// "<name><i>" (spelled so that GCC 12 raises no false -Wrestrict on "p" + to_string).
std::string numbered(const char* name, int i) {
  std::string s = name;
  s += std::to_string(i);
  return s;
}

void ip(const std::vector<std::string>& args) {
  IpResult r = run_ip(args);
  if (r.code != 0)
    throw std::runtime_error("VirtualHosts: `" + joined(args) + "` failed (exit " +
                             std::to_string(r.code) + "): " + r.out);
}

// The namespace behind /run/netns/<name> or /proc/<pid>/ns/net, as (device, inode).
bool ns_id(const std::string& path, std::pair<dev_t, ino_t>* id) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *id = {st.st_dev, st.st_ino};
  return true;
}

// Live processes in the namespace of /run/netns/<name> (a zombie has left its namespaces).
std::vector<pid_t> pids_in(const std::string& netns) {
  std::vector<pid_t> out;
  std::pair<dev_t, ino_t> want, got;
  if (!ns_id("/run/netns/" + netns, &want)) return out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == ::getpid()) continue;
    if (ns_id("/proc/" + std::string(e->d_name) + "/ns/net", &got) && got == want)
      out.push_back(pid_t(pid));
  }
  ::closedir(d);
  return out;
}

int decode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// SIGKILL to everything in `netns` until nothing there is alive (bounded: 10 s).
void empty_namespace(const std::string& netns) {
  for (int round = 0; round < 1000; ++round) {
    std::vector<pid_t> left = pids_in(netns);
    if (left.empty()) return;
    for (pid_t p : left) ::kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void delete_namespace(const std::string& netns) {
  IpResult r = run_ip({"netns", "delete", netns});
  if (r.code != 0 && fs::exists("/run/netns/" + netns))
    std::fprintf(stderr, "VirtualHosts: `ip netns delete %s` failed: %s\n", netns.c_str(),
                 r.out.c_str());
}

// Namespaces of VirtualHosts whose process no longer exists (it died without its
// destructor): emptied and deleted, so that leaks do not pile up across runs.
void sweep_stale() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kOwnerPrefix, 0) != 0) continue;
    const long owner = std::strtol(name.c_str() + kOwnerPrefix.size(), nullptr, 10);
    if (owner <= 0 || owner == ::getpid() || ::kill(pid_t(owner), 0) == 0 || errno != ESRCH)
      continue;
    std::fprintf(stderr, "VirtualHosts: deleting %s, left by process %ld which is gone\n",
                 name.c_str(), owner);
    empty_namespace(name);
    delete_namespace(name);
  }
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kOwnerPrefix, 0) != 0) continue;
    const long owner = std::strtol(name.c_str() + kOwnerPrefix.size(), nullptr, 10);
    if (owner > 0 && owner != ::getpid() && ::kill(pid_t(owner), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), ec);
  }
}

}  // namespace

bool VirtualHosts::available(std::string* why) {
  static const std::string reason = [] {
    if (::geteuid() != 0)
      return "not root (euid " + std::to_string(::geteuid()) +
             "): network namespaces, veths and bridges need CAP_SYS_ADMIN and CAP_NET_ADMIN";
    if (::access("/etc/hosts", F_OK) != 0)
      return std::string("no /etc/hosts to bind each host's names over");
    IpResult v = run_ip({"-V"});
    if (v.code != 0) return "no usable `ip` (iproute2) in PATH: " + v.out;
    const std::string probe = kOwnerPrefix + std::to_string(::getpid()) + "-probe";
    std::string r;
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"netns", "add", probe},
          {"-n", probe, "link", "add", "brprobe", "type", "bridge"},
          {"-n", probe, "link", "add", "vprobe0", "type", "veth", "peer", "name", "vprobe1"}}) {
      IpResult x = run_ip(args);
      if (x.code != 0) {
        r = "`" + joined(args) + "` failed: " + x.out;
        break;
      }
    }
    run_ip({"netns", "delete", probe});
    return r;
  }();
  if (why) *why = reason;
  return reason.empty();
}

VirtualHosts::VirtualHosts(int n) {
  if (n < 1 || n > 250)
    throw std::invalid_argument("VirtualHosts: " + std::to_string(n) + " hosts (1 to 250 fit)");
  static std::atomic<int> seq{0};
  const int me = int(::getpid()), k = seq++;
  prefix_ = kOwnerPrefix + std::to_string(me) + "-" + std::to_string(k);
  sweep_stale();
  // 10.<x>.<y>.0/24: only these namespaces hold it, so a clash with another process's
  // subnet could not matter either; it is per process for readable logs.
  const std::string subnet = "10." + std::to_string(64 + ((me >> 8) & 127)) + "." +
                             std::to_string((me + 37 * k) & 255) + ".";
  try {
    dir_ = (fs::temp_directory_path() / prefix_).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    {
      std::ofstream hosts(dir_ + "/hosts");
      hosts << "127.0.0.1 localhost\n::1 localhost\n";
      for (int i = 0; i < n; ++i) hosts << subnet << (i + 1) << " host" << i << "\n";
      if (!hosts) throw std::runtime_error("VirtualHosts: cannot write " + dir_ + "/hosts");
    }
    switch_ = prefix_ + "-sw";
    ip({"netns", "add", switch_});
    ip({"-n", switch_, "link", "set", "lo", "up"});
    for (const char* br : {"br0", "br1"}) {
      ip({"-n", switch_, "link", "add", br, "type", "bridge"});
      ip({"-n", switch_, "link", "set", br, "up"});
    }
    for (int i = 0; i < n; ++i) {
      Host h;
      h.netns = prefix_ + numbered("-h", i);
      h.hostname = numbered("host", i);
      h.address = subnet + std::to_string(i + 1);
      ip({"netns", "add", h.netns});
      hosts_.push_back(h);
      const std::string port = numbered("p", i);
      ip({"-n", switch_, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
          h.netns});
      ip({"-n", switch_, "link", "set", port, "master", "br0"});
      ip({"-n", switch_, "link", "set", port, "up"});
      ip({"-n", h.netns, "link", "set", "lo", "up"});
      ip({"-n", h.netns, "addr", "add", h.address + "/24", "dev", "eth0"});
      ip({"-n", h.netns, "link", "set", "eth0", "up"});
      hosts_.back().netns_fd = ::open(("/run/netns/" + h.netns).c_str(), O_RDONLY | O_CLOEXEC);
      if (hosts_.back().netns_fd < 0)
        throw std::runtime_error("VirtualHosts: cannot open /run/netns/" + h.netns + ": " +
                                 std::strerror(errno));
    }
  } catch (...) {
    destroy();
    throw;
  }
}

VirtualHosts::~VirtualHosts() { destroy(); }

void VirtualHosts::destroy() noexcept {
  try {
    // Everything on every host, including workers in process groups of their own and
    // processes stopped with SIGSTOP (SIGKILL ends those too).
    for (pid_t p : started_) ::killpg(p, SIGKILL);
    for (const Host& h : hosts_) empty_namespace(h.netns);
    for (pid_t p : started_) {
      ::kill(p, SIGKILL);
      while (::waitpid(p, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    started_.clear();
    for (Host& h : hosts_) {
      if (h.netns_fd >= 0) ::close(h.netns_fd);
      h.netns_fd = -1;
      delete_namespace(h.netns);
    }
    hosts_.clear();
    if (!switch_.empty()) delete_namespace(switch_);
    switch_.clear();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "VirtualHosts: cleanup failed: %s\n", e.what());
  }
}

pid_t VirtualHosts::start(int i, const std::vector<std::string>& argv, const std::string& log,
                          const std::vector<std::string>& env) {
  const Host& h = hosts_.at(size_t(i));
  const std::string hosts_file = dir_ + "/hosts";
  std::vector<std::string> env_copy = env;  // putenv keeps the pointers
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("VirtualHosts: fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the test died: so does its host's agent
    if (::getppid() != parent) ::_exit(127);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (fd > 2) ::close(fd);
    }
    auto fail = [&](const char* what) {
      ::dprintf(2, "VirtualHosts: cannot start %s on %s: %s: %s\n", argv.at(0).c_str(),
                h.hostname.c_str(), what, std::strerror(errno));
      ::_exit(127);
    };
    if (::setns(h.netns_fd, CLONE_NEWNET) != 0) fail("setns(CLONE_NEWNET)");
    if (::unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0) fail("unshare(CLONE_NEWUTS|CLONE_NEWNS)");
    // Private mounts first: the bind below must not propagate to the machine's /etc/hosts.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail("mount / private");
    if (::sethostname(h.hostname.c_str(), h.hostname.size()) != 0) fail("sethostname");
    if (::mount(hosts_file.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0)
      fail("bind mount over /etc/hosts");
    for (std::string& kv : env_copy) ::putenv(kv.data());
    ::execvp(args[0], args.data());
    fail("exec");
  }
  ::setpgid(pid, pid);  // also here, so the group exists before anyone signals it
  started_.push_back(pid);
  return pid;
}

int VirtualHosts::wait(pid_t pid) {
  if (auto it = reaped_.find(pid); it != reaped_.end()) return it->second;
  int status = 0;
  pid_t r;
  while ((r = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (r != pid)
    throw std::runtime_error("VirtualHosts: wait for " + std::to_string(pid) +
                             ", which start() did not make");
  std::erase(started_, pid);
  return reaped_[pid] = decode(status);
}

bool VirtualHosts::ended(pid_t pid) {
  if (reaped_.count(pid)) return true;
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG) != pid) return false;
  std::erase(started_, pid);
  reaped_[pid] = decode(status);
  return true;
}

std::vector<pid_t> VirtualHosts::pids(int i) const { return pids_in(hosts_.at(size_t(i)).netns); }

int VirtualHosts::signal_host(int i, int sig) {
  // A process may start another between the scan and the signal: scan until nothing new.
  std::set<pid_t> done;
  for (int round = 0; round < 10; ++round) {
    bool fresh = false;
    for (pid_t p : pids(i))
      if (done.insert(p).second) {
        ::kill(p, sig);
        fresh = true;
      }
    if (!fresh) break;
  }
  return int(done.size());
}

void VirtualHosts::limit_rate_to(int i, int j, int port, int kbit) {
  const std::string ns = hosts_.at(size_t(i)).netns, to = hosts_.at(size_t(j)).address;
  auto tc = [](const std::vector<std::string>& args) {
    IpResult r = run_tool("tc", args);
    if (r.code != 0)
      throw std::runtime_error("VirtualHosts: `" + joined(args, "tc") + "` failed (exit " +
                               std::to_string(r.code) + "): " + r.out);
  };
  // htb (the classful qdisc this kernel has): class 1:10 takes everything at full speed as
  // before, the filter sends the one service's packets to class 1:30, capped at the rate.
  tc({"-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10"});
  tc({"-n", ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate",
      "10gbit", "quantum", "60000"});
  tc({"-n", ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:30", "htb", "rate",
      std::to_string(kbit) + "kbit", "ceil", std::to_string(kbit) + "kbit"});
  tc({"-n", ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
      "u32", "match", "ip", "dst", to + "/32", "match", "ip", "dport", std::to_string(port),
      "0xffff", "flowid", "1:30"});
}

void VirtualHosts::link_down(int i) {
  (void)hosts_.at(size_t(i));
  ip({"-n", switch_, "link", "set", numbered("p", i), "down"});
}

void VirtualHosts::link_up(int i) {
  (void)hosts_.at(size_t(i));
  ip({"-n", switch_, "link", "set", numbered("p", i), "up"});
  forget_neighbours();
}

void VirtualHosts::partition(const std::vector<int>& island) {
  for (int i : island) {
    (void)hosts_.at(size_t(i));
    ip({"-n", switch_, "link", "set", numbered("p", i), "master", "br1"});
    island_.push_back(i);
  }
}

void VirtualHosts::heal() {
  for (int i : island_) ip({"-n", switch_, "link", "set", numbered("p", i), "master", "br0"});
  island_.clear();
  forget_neighbours();
}

void VirtualHosts::forget_neighbours() {
  // An address that went unanswered while cut off stays "incomplete" (or "failed") in the
  // ARP cache and is asked for again only at the next retransmit, a second later: a fresh
  // entry asks at once.
  for (const Host& h : hosts_) ip({"-n", h.netns, "neigh", "flush", "all"});
}

void VirtualHosts::in_host(int i, const std::function<void()>& fn) const {
  const int fd = hosts_.at(size_t(i)).netns_fd;
  std::exception_ptr error;
  std::thread t([&] {
    try {
      if (::setns(fd, CLONE_NEWNET) != 0)
        throw std::runtime_error(std::string("VirtualHosts: setns: ") + std::strerror(errno));
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace weft::test
