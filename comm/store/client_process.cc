// ClientProcess: a store client's process identity from /proc, and a pidfd to watch it.
#include "comm/store/client_process.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace weft::comm {
namespace {

// Field 22 of /proc/<pid>/stat (starttime), read after the command name's closing
// parenthesis (the name may hold spaces and parentheses itself).
std::optional<uint64_t> start_ticks(const std::string& stat_path) {
  std::ifstream in(stat_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string f;
  for (int i = 3; i <= 22; ++i)  // fields 3 (state) .. 22 (starttime)
    if (!(fields >> f)) return std::nullopt;
  try {
    return std::stoull(f);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::pair<uint64_t, uint64_t>> own_pid_ns() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return std::nullopt;
  return std::make_pair(uint64_t(st.st_dev), uint64_t(st.st_ino));
}

}  // namespace

std::optional<ClientProcess> this_client_process() {
  const std::optional<std::pair<uint64_t, uint64_t>> ns = own_pid_ns();
  const std::optional<uint64_t> start = start_ticks("/proc/self/stat");
  if (!ns || !start) return std::nullopt;
  return ClientProcess{int64_t(::getpid()), ns->first, ns->second, *start};
}

int open_client_process(const ClientProcess& p) {
#ifdef SYS_pidfd_open
  const std::optional<std::pair<uint64_t, uint64_t>> ns = own_pid_ns();
  if (!ns || ns->first != p.pid_ns_dev || ns->second != p.pid_ns_ino || p.pid <= 0) return -1;
  const int fd = int(::syscall(SYS_pidfd_open, pid_t(p.pid), 0));
  if (fd < 0) return -1;
  // The pidfd now pins the pid: if /proc still shows the start time the client sent, the
  // pidfd is that process's (a zombie's /proc entry stays too, so an exit in between is
  // still seen, by the pidfd).
  const std::optional<uint64_t> start = start_ticks("/proc/" + std::to_string(p.pid) + "/stat");
  if (start && *start == p.start_ticks) {
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
  }
  ::close(fd);
#else
  (void)p;
#endif
  return -1;
}

}  // namespace weft::comm
