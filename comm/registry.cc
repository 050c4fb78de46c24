// The backend table. Each engine's entry exists only when base/config.h says it was found;
// the loopback entry always does.
#include "comm/registry.h"

#include "base/check.h"
#include "base/config.h"
#include "base/error.h"
#include "comm/backend.h"
#include "comm/loopback.h"
#if WEFT_HAVE_GLOO
#include "comm/gloo/gloo_communicator.h"
#endif
#if WEFT_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif
#if WEFT_HAVE_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace weft::comm {

namespace {

struct BackendEntry {
  BackendKind kind;
  std::unique_ptr<Communicator> (*make)(const CommOptions&);
};

constexpr BackendEntry kBackends[] = {
    {BackendKind::kLoopback, &make_loopback_communicator},
#if WEFT_HAVE_GLOO
    {BackendKind::kGloo, &make_gloo_communicator},
#endif
#if WEFT_HAVE_MPI
    {BackendKind::kMpi, &make_mpi_communicator},
#endif
#if WEFT_HAVE_NCCL
    {BackendKind::kNccl, &make_nccl_communicator},
#endif
};

const BackendEntry* find(BackendKind kind) {
  for (const BackendEntry& e : kBackends)
    if (e.kind == kind) return &e;
  return nullptr;
}

// What to install or switch on when a backend is missing from this build.
const char* how_to_get(BackendKind kind) {
  switch (kind) {
    case BackendKind::kLoopback:
      return "";
    case BackendKind::kGloo:
      return "install libgloo-dev and configure with -DWEFT_WITH_GLOO=ON";
    case BackendKind::kMpi:
      return "install libopenmpi-dev and configure with -DWEFT_WITH_MPI=ON";
    case BackendKind::kNccl:
      return "install CUDA and NCCL and configure with -DWEFT_WITH_CUDA=ON -DWEFT_WITH_NCCL=ON";
  }
  return "";
}

}  // namespace

std::unique_ptr<Communicator> make_communicator(BackendKind kind, const CommOptions& opts) {
  const BackendEntry* e = find(kind);
  if (!e)
    throw NotSupported(str("communicator backend '", backend_name(kind),
                           "' is not part of this build: ", how_to_get(kind)));
  return e->make(opts);
}

bool backend_available(BackendKind kind) { return find(kind) != nullptr; }

std::vector<BackendKind> available_backends() {
  std::vector<BackendKind> kinds;
  for (const BackendEntry& e : kBackends) kinds.push_back(e.kind);
  return kinds;
}

BackendKind parse_backend(const std::string& name, const std::string& field) {
  for (BackendKind k :
       {BackendKind::kLoopback, BackendKind::kGloo, BackendKind::kMpi, BackendKind::kNccl})
    if (name == backend_name(k)) return k;
  throw ConfigError(field, str("unknown communicator backend '", name,
                               "'; expected loopback, gloo, mpi or nccl"));
}

}  // namespace weft::comm
