// Hosts as network namespaces, for tests of several machines on one: each host has its own
// network stack, address, hostname and /etc/hosts, and a veth cable into a bridge that lives
// in a namespace of its own, so nothing here touches the machine's real interfaces.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace weft::test {

// N hosts on one private switch. Host i is the network namespace netns(i), with loopback
// up and eth0 = address(i)/24 in a subnet derived from this process's pid (it is reachable
// only from the other hosts: nothing routes to or from the machine's own network). Every
// process started on host i also gets its own UTS and mount namespaces: its hostname is
// hostname(i) ("host<i>") and its /etc/hosts maps every host's name to its address, so a
// program there finds itself and the others by name as on real machines.
//
// The destructor kills (SIGKILL) every process on every host, agents and whatever they
// started, reaps the ones this object started, waits until the others are gone, and deletes
// the namespaces (with them the veths and the bridges) and the hosts file, whether or not the
// test failed. Namespaces left by a test process that died without its destructor (a crash, a
// ctest timeout) are swept by the next VirtualHosts of any process. Names carry the owner's
// pid ("weft-vh-<pid>-<n>-h<i>"), so parallel ctest runs never collide.
//
// Threads: one thread (the test's) owns the object; start() sets the children's parent-death
// signal, which fires when the thread that called start() exits. in_host() may run on any
// thread. Errors: the constructor and the link methods throw std::runtime_error naming the
// `ip` command that failed and its output.
class VirtualHosts {
 public:
  // Whether this process can create hosts (root, `ip` with netns support, a namespace can be
  // made); when not, *why (if given) says what is missing, for GTEST_SKIP.
  static bool available(std::string* why = nullptr);

  explicit VirtualHosts(int n);
  ~VirtualHosts();  // never throws
  VirtualHosts(const VirtualHosts&) = delete;
  VirtualHosts& operator=(const VirtualHosts&) = delete;

  int size() const { return int(hosts_.size()); }
  const std::string& address(int i) const { return hosts_.at(size_t(i)).address; }
  const std::string& hostname(int i) const { return hosts_.at(size_t(i)).hostname; }
  const std::string& netns(int i) const { return hosts_.at(size_t(i)).netns; }

  // Starts argv (argv[0] looked up in PATH unless it holds a '/') on host i in a process
  // group of its own, with stdout and stderr appended to `log` and the extra `env` entries
  // ("K=V") on top of this process's environment. Returns its pid: the caller may signal it
  // and wait() for it. When the child cannot enter the host it writes why to `log` and exits
  // with 127.
  pid_t start(int i, const std::vector<std::string>& argv, const std::string& log,
              const std::vector<std::string>& env = {});
  // Waits for a process start() returned; its exit code, or 128 + the signal that killed it
  // (again on later calls). Throws std::runtime_error for a pid start() did not return.
  int wait(pid_t pid);
  // Whether that process has ended (reaping it; wait() then returns its code at once).
  bool ended(pid_t pid);

  // Every live process on host i (the ones start() made and all they started), by pid.
  std::vector<pid_t> pids(int i) const;
  // Sends `sig` to every process on host i (SIGSTOP: the host freezes; SIGKILL: it dies).
  // Returns how many processes got it.
  int signal_host(int i, int sig);

  // Host i's packets to TCP port `port` of host j leave at `kbit` kbit/s at most (tc: an htb
  // class behind a filter on the destination); everything else at full speed. Once per host. A
  // slow path to one service (a peer's snapshot agent), not a slow host.
  void limit_rate_to(int i, int j, int port, int kbit);

  // Host i's cable: unplugged at the switch (both ends lose carrier) or plugged back (then
  // every host forgets the neighbours it could not reach, so it asks again at once).
  void link_down(int i);
  void link_up(int i);
  // Moves the hosts of `island` to a second switch: they reach each other but not the rest,
  // until heal() (which also makes every host forget unreachable neighbours). One partition
  // at a time (a second call adds hosts to the island).
  void partition(const std::vector<int>& island);
  void heal();

  // Runs fn on a thread that has entered host i's network namespace (sockets it opens belong
  // to host i and stay there after it returns); rethrows what fn throws.
  void in_host(int i, const std::function<void()>& fn) const;

 private:
  struct Host {
    std::string netns, hostname, address;
    int netns_fd = -1;
  };
  void destroy() noexcept;
  void forget_neighbours();

  std::string prefix_;  // "weft-vh-<pid>-<n>"
  std::string switch_;  // the bridge's namespace
  std::string dir_;     // holds the hosts file
  std::vector<Host> hosts_;
  std::vector<pid_t> started_;   // not yet reaped
  std::map<pid_t, int> reaped_;  // exit codes of the reaped ones
  std::vector<int> island_;
};

}  // namespace weft::test
