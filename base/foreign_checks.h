// The one place that turns foreign error codes (MPI, NCCL, CUDA, cuBLAS) and Gloo's exceptions into
// Weft's typed errors, recording the statement, file, line and the library's own message
// (after NCCL's src/include/checks.h). The macros name the foreign API only when expanded, so
// this header includes none of them; include mpi.h / nccl.h / gloo headers before use.
#pragma once

#include <string>

#include "base/check.h"
#include "base/error.h"

namespace weft::detail {

// kDevice: a compute-side failure (a kernel, a cuBLAS call, device memory) raised as a plain
// weft::Error, so the elastic path, which catches CommError, does not mistake it for a lost peer.
enum class FailureKind { kComm, kTimeout, kPeerLost, kDevice };

// How a backend classifies a foreign failure; peer is -1 when unknown.
struct ForeignFailure {
  FailureKind kind = FailureKind::kComm;
  int peer = -1;
};

[[noreturn]] inline void raise_foreign(ForeignFailure failure, const char* library,
                                       const char* stmt, const char* file, int line,
                                       const std::string& message) {
  std::string what = str(library, " failed in `", stmt, "` at ", file, ":", line, ": ", message);
  switch (failure.kind) {
    case FailureKind::kTimeout:
      throw TimeoutError(what);
    case FailureKind::kPeerLost:
      throw PeerLostError(failure.peer, failure.peer >= 0
                                            ? str("peer rank ", failure.peer, " lost: ", what)
                                            : str("peer lost: ", what));
    case FailureKind::kDevice:
      throw Error(what);
    case FailureKind::kComm:
      break;
  }
  throw CommError(what);
}

}  // namespace weft::detail

// MPI calls return an int error code; communicators must use MPI_ERRORS_RETURN.
#define WEFT_MPI_CHECK(stmt)                                                          \
  do {                                                                                \
    int weft_rc_ = (stmt);                                                            \
    if (weft_rc_ != MPI_SUCCESS) [[unlikely]] {                                       \
      char weft_msg_[MPI_MAX_ERROR_STRING];                                           \
      int weft_len_ = 0;                                                              \
      MPI_Error_string(weft_rc_, weft_msg_, &weft_len_);                              \
      ::weft::detail::raise_foreign({}, "MPI", #stmt, __FILE__, __LINE__,       \
                                          std::string(weft_msg_, size_t(weft_len_))); \
    }                                                                                 \
  } while (0)

#define WEFT_CUDA_CHECK(stmt)                                                    \
  do {                                                                           \
    cudaError_t weft_rc_ = (stmt);                                               \
    if (weft_rc_ != cudaSuccess) [[unlikely]]                                    \
      ::weft::detail::raise_foreign({}, "CUDA", #stmt, __FILE__, __LINE__, \
                                          cudaGetErrorString(weft_rc_));         \
  } while (0)

// Compute-side CUDA calls (core/cuda/): the same record, raised as a device failure.
#define WEFT_CUDA_DEVICE_CHECK(stmt)                                                    \
  do {                                                                                  \
    cudaError_t weft_rc_ = (stmt);                                                      \
    if (weft_rc_ != cudaSuccess) [[unlikely]]                                           \
      ::weft::detail::raise_foreign({::weft::detail::FailureKind::kDevice}, \
                                          "CUDA", #stmt, __FILE__, __LINE__,            \
                                          cudaGetErrorString(weft_rc_));                \
  } while (0)

// cuBLASLt returns cublasStatus_t; include cublasLt.h before use.
#define WEFT_CUBLASLT_CHECK(stmt)                                                       \
  do {                                                                                  \
    cublasStatus_t weft_rc_ = (stmt);                                                   \
    if (weft_rc_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                 \
      ::weft::detail::raise_foreign({::weft::detail::FailureKind::kDevice}, \
                                          "cuBLASLt", #stmt, __FILE__, __LINE__,        \
                                          cublasLtGetStatusString(weft_rc_));           \
  } while (0)

// NCCL communicators are non-blocking (config.blocking = 0), so ncclInProgress is not an
// error here: the caller polls ncclCommGetAsyncError. ncclRemoteError means a peer failed.
#define WEFT_NCCL_CHECK(stmt)                                                                      \
  do {                                                                                             \
    ncclResult_t weft_rc_ = (stmt);                                                                \
    if (weft_rc_ != ncclSuccess && weft_rc_ != ncclInProgress) [[unlikely]] {                      \
      ::weft::detail::ForeignFailure weft_f_;                                                \
      if (weft_rc_ == ncclRemoteError)                                                             \
        weft_f_.kind = ::weft::detail::FailureKind::kPeerLost;                               \
      const char* weft_last_ = ncclGetLastError(nullptr);                                          \
      ::weft::detail::raise_foreign(                                                         \
          weft_f_, "NCCL", #stmt, __FILE__, __LINE__,                                              \
          std::string(ncclGetErrorString(weft_rc_)) +                                              \
              (weft_last_ && *weft_last_ ? std::string(" (") + weft_last_ + ")" : std::string())); \
    }                                                                                              \
  } while (0)

// Gloo reports failures as exceptions (gloo::IoException for transport errors and timeouts,
// gloo::EnforceNotMet for violated preconditions). `classify` maps the message to a kind and
// a peer, which only the communicator knows (it holds the peers' addresses). Weft's own
// errors (from the store adapter during rendezvous) pass through unchanged.
#define WEFT_GLOO_CHECK(stmt, classify)                                                   \
  do {                                                                                    \
    try {                                                                                 \
      stmt;                                                                               \
    } catch (const ::weft::Error&) {                                                      \
      throw;                                                                              \
    } catch (const std::exception& weft_e_) {                                             \
      std::string weft_msg_ = weft_e_.what();                                             \
      ::weft::detail::raise_foreign((classify)(weft_msg_), "Gloo", #stmt, __FILE__, \
                                          __LINE__, weft_msg_);                           \
    }                                                                                     \
  } while (0)
