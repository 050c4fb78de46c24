// `weft bench snapshot`: what the in-memory snapshots (issue 15) cost on this machine, beside
// memcpy measured in the same run. Run by parts; `encode` (the erasure code and crc32c) now,
// the per-step overhead and the recovery parts later.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// args excludes "snapshot": [--parts encode] [--mib N]. Prints one section per part to stdout
// (progress lines to stderr) and returns the exit code. Throws ConfigError naming the option
// for a bad one, NotSupported when built without ISA-L.
int bench_snapshot(const std::vector<std::string>& args);

}  // namespace weft::launch
