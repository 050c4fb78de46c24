// CPU time of the calling thread and of the process: what a piece of work cost on a busy
// machine, where its wall time also holds the slices other processes took from its core.
#pragma once

#include <ctime>

namespace weft {

inline double cpu_clock_s(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// This thread's CPU time, seconds.
inline double thread_cpu_s() { return cpu_clock_s(CLOCK_THREAD_CPUTIME_ID); }

// This process's CPU time (every thread), seconds.
inline double process_cpu_s() { return cpu_clock_s(CLOCK_PROCESS_CPUTIME_ID); }

}  // namespace weft
