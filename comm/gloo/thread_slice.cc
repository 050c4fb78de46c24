// sched_setattr(2) and sched_getattr(2) have no glibc wrappers: the raw system calls.
#include "comm/gloo/thread_slice.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace weft::comm {

namespace {

// The kernel's struct sched_attr (include/uapi/linux/sched/types.h), first version's fields
// plus the utilisation clamps; the kernel accepts any size it knows.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period;
  uint32_t sched_util_min, sched_util_max;
};

bool get_attr(pid_t tid, SchedAttr& a) noexcept {
  std::memset(&a, 0, sizeof a);
  return ::syscall(SYS_sched_getattr, tid, &a, unsigned(sizeof a), 0u) == 0;
}

}  // namespace

bool set_thread_slice(std::chrono::nanoseconds slice) noexcept {
  SchedAttr a;
  if (!get_attr(0, a)) return false;
  if (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH) return false;
  const uint64_t want = uint64_t(slice.count());
  if (a.sched_runtime == want) return true;
  a.size = sizeof a;
  a.sched_flags = 0;  // keep the clamps as they are (no SCHED_FLAG_UTIL_CLAMP)
  a.sched_runtime = want;
  if (::syscall(SYS_sched_setattr, 0, &a, 0u) != 0) return false;
  // A kernel without custom slices takes the call and ignores the runtime.
  return thread_slice().count() == slice.count();
}

std::chrono::nanoseconds thread_slice(pid_t tid) noexcept {
  SchedAttr a;
  if (!get_attr(tid, a)) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(int64_t(a.sched_runtime));
}

}  // namespace weft::comm
