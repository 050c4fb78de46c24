// The scheduler slice of the threads that carry a rank's communication.
//
// Linux's EEVDF scheduler (6.6 on) lets a running thread keep its core until it has had its
// slice (0.7 ms x (1 + log2 cores): 1.4 ms on a 2-core host) before a woken thread of the
// same weight preempts it; from 6.12 a thread may ask for a shorter slice
// (sched_attr.sched_runtime under SCHED_OTHER), and a woken thread with a shorter slice than
// the running one preempts it at once. A small collective is a chain of wake-ups (the caller
// hands it to the communicator's worker, the peer's transport thread reads it and wakes its
// worker, which wakes its caller): where the ranks share cores with each other or with other
// work, each link waited runnable behind a computing thread, and a 4-byte all-reduce at the
// end of a pipeline's step took 1.5-4 ms instead of 0.1 (docs/planner.md, "the scheduler's
// slice").
#pragma once

#include <sys/types.h>

#include <chrono>

namespace weft::comm {

// Short enough that a woken communication thread preempts a computing one; the kernel's
// least is 100 us, and a computing thread runs at least that long between preemptions.
inline constexpr std::chrono::microseconds kCommThreadSlice{100};

// Asks the kernel for `slice` on the calling thread, keeping its policy and nice value
// (threads it creates from then on inherit it). False where the kernel keeps the default:
// before 6.12, or a real-time thread. Never throws: a slice is a latency hint, not a contract.
bool set_thread_slice(std::chrono::nanoseconds slice) noexcept;

// Thread `tid`'s slice (0: the calling thread): the default where it asked for none; zero
// where the kernel does not say.
std::chrono::nanoseconds thread_slice(pid_t tid = 0) noexcept;

}  // namespace weft::comm
