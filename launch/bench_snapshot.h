// `weft bench snapshot`: what the in-memory snapshots (issue 15) cost on this machine, each
// number beside its bound measured in the same run. Run by parts: `encode` (the erasure code
// and crc32c against memcpy), `overhead` (a training step with snapshots against without,
// and against the copy's own cost), `recovery` (a killed worker's restart from the node's
// snapshots against one from a durable checkpoint).
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// args excludes "snapshot" (`weft bench snapshot --help` lists the options). Prints one
// section per part to stdout (progress lines to stderr) and returns the exit code: 1 when a
// part's job failed (the others still run). Throws ConfigError naming the option for a bad
// one or a job that cannot run here, NotSupported when the encode part is named and the
// build has no ISA-L (run by default, it is skipped with a line).
int bench_snapshot(const std::vector<std::string>& args);

}  // namespace weft::launch
