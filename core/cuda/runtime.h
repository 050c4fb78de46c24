// The CUDA device as Weft sees it: device queries, a stream and an event with RAII, and
// the check that turns "no GPU" into a clear user-facing error. Every CUDA call in
// core/cuda/ goes through base/foreign_checks.h (WEFT_CUDA_DEVICE_CHECK, WEFT_CUBLASLT_CHECK).
#pragma once

#include <cstddef>
#include <string>

// Forward declarations keep cuda_runtime.h out of the headers users include.
struct CUstream_st;
struct CUevent_st;

namespace weft::core::cuda {

using StreamHandle = CUstream_st*;

// Number of visible GPUs; 0 when there is none or the driver is missing (never throws:
// "no device" is an answer here, not an error).
int device_count();
// Why device_count() is 0, in the runtime's words ("no CUDA-capable device is detected").
std::string no_device_reason();
// Throws ConfigError(field, ...) naming the fix when no GPU is visible; used by
// `weft train` for `device: cuda`.
void require_device(const std::string& field);
// "NVIDIA H200, 139.8 GiB, sm_90" for logs and the benchmark table.
std::string device_description(int device);

// Makes `device` current on the calling thread. Throws weft::Error on a CUDA failure.
void set_device(int device);

// An owned non-blocking stream on the current device. Not copyable; movable.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  StreamHandle get() const { return s_; }
  // Blocks the host until all work issued so far has finished; rethrows a kernel fault.
  void synchronize() const;

 private:
  StreamHandle s_ = nullptr;
};

// An owned event (timing enabled) for ordering streams and measuring kernels.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(StreamHandle s);
  void synchronize() const;
  // Milliseconds between `start` and this event; both must have completed.
  float elapsed_ms_since(const Event& start) const;

 private:
  CUevent_st* e_ = nullptr;
};

// Checks the last kernel launch (configuration errors surface here, faults at the next
// synchronising call). `what` names the kernel in the error.
void check_launch(const char* what);

}  // namespace weft::core::cuda
