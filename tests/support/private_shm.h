// A private /dev/shm for a test: the test process moves into a mount namespace of its own
// and mounts a tmpfs of a chosen size on /dev/shm, which every process it starts inherits
// (snapshot agents, weft run and its workers). A nearly full /dev/shm then costs a few MiB of
// memory, and the system's /dev/shm is never touched. Where the namespace or the mount is
// not permitted (not root, a container without CAP_SYS_ADMIN) or memory is short, it says
// why, for GTEST_SKIP. Header-only: each test binary that needs it includes it.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

namespace weft::test {

class PrivateShm {
 public:
  // The snapshot agent's margin (launch/snapshot_agent.h, snapshot_memory_margin): 5% of
  // MemTotal, at least 256 MiB. A tmpfs of margin + n bytes leaves a new segment n bytes.
  static int64_t snapshot_margin() {
    return std::max<int64_t>(int64_t(256) << 20, meminfo("MemTotal:") / 20);
  }

  // A tmpfs of `bytes` on /dev/shm, or skip_reason() saying why not.
  explicit PrivateShm(int64_t bytes) {
    const int64_t available = meminfo("MemAvailable:");
    if (available < bytes + (int64_t(512) << 20)) {
      why_ = "MemAvailable is " + std::to_string(available >> 20) + " MiB: under the " +
             std::to_string(bytes >> 20) +
             " MiB tmpfs this test sizes /dev/shm to (the agent would judge MemAvailable, not "
             "/dev/shm)";
      return;
    }
    ns_ = ::open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (ns_ < 0) {
      why_ = std::string("cannot open /proc/self/ns/mnt: ") + std::strerror(errno);
      return;
    }
    if (::unshare(CLONE_NEWNS) != 0) {
      why_ = std::string("unshare(CLONE_NEWNS) is not permitted here (") + std::strerror(errno) +
             "): this test needs root (CAP_SYS_ADMIN) for a private /dev/shm";
      return;
    }
    unshared_ = true;
    const std::string opts = "size=" + std::to_string(bytes >> 10) + "k,mode=1777";
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      why_ = std::string("cannot mount a private tmpfs on /dev/shm (") + std::strerror(errno) +
             "): this test needs mount permission in its own mount namespace";
      return;
    }
    mounted_ = true;
  }
  // Unmounts (freeing what was written there) and returns to the test's mount namespace;
  // `error()` says when that return failed.
  ~PrivateShm() { leave(); }
  PrivateShm(const PrivateShm&) = delete;
  PrivateShm& operator=(const PrivateShm&) = delete;

  const std::string& skip_reason() const { return why_; }
  // Empty, or why the test's process could not return to its mount namespace.
  std::string leave() {
    std::string error;
    if (mounted_) ::umount2("/dev/shm", MNT_DETACH);
    mounted_ = false;
    if (unshared_ && ::setns(ns_, CLONE_NEWNS) != 0)
      error = std::string("cannot return to the test's mount namespace: ") + std::strerror(errno);
    unshared_ = false;
    if (ns_ >= 0) ::close(ns_);
    ns_ = -1;
    return error;
  }

 private:
  static int64_t meminfo(const std::string& field) {
    std::ifstream in("/proc/meminfo");
    std::string key, rest;
    int64_t kib = 0;
    while (in >> key >> kib) {
      std::getline(in, rest);
      if (key == field) return kib * 1024;
    }
    return 0;
  }
  std::string why_;
  int ns_ = -1;
  bool unshared_ = false, mounted_ = false;
};

}  // namespace weft::test
