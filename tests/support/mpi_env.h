// Detects an mpirun launch so that MPI tests can GTEST_SKIP with a reason outside one
// (flashlight's AllReduceTest pattern): `if (!under_mpirun()) GTEST_SKIP() << kNotUnderMpirun;`
#pragma once

#include <cstdlib>
#include <string>

namespace weft::test {

inline constexpr const char* kNotUnderMpirun =
    "not launched by mpirun (OMPI_COMM_WORLD_SIZE unset); run through ctest -L mp, which uses "
    "MPIEXEC_EXECUTABLE --oversubscribe";

// True when Open MPI's launcher started this process.
inline bool under_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

// Rank and size from Open MPI's environment; -1 when not under mpirun.
inline int mpirun_rank() {
  const char* v = std::getenv("OMPI_COMM_WORLD_RANK");
  return v ? std::atoi(v) : -1;
}
inline int mpirun_size() {
  const char* v = std::getenv("OMPI_COMM_WORLD_SIZE");
  return v ? std::atoi(v) : -1;
}

}  // namespace weft::test
