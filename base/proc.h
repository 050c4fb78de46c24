// Processes as /proc shows them: what `weft run`'s tests and benchmarks need to find an
// agent's workers (its children) and tell them from its guardian (no WEFT_RANK).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace weft {

// Every process whose parent is `parent` now, zombies included (a process that exits while
// /proc is read is skipped).
std::vector<pid_t> child_pids(pid_t parent);
// Whether process `pid` exists and is not a zombie.
bool process_running(pid_t pid);
// The WEFT_RANK in process `pid`'s environment, or -1 (none, or the process went).
int weft_rank_of(pid_t pid);
// The running child of `parent` whose WEFT_RANK is `rank` (any rank when `rank` < 0), or -1.
pid_t worker_child(pid_t parent, int rank = -1);

}  // namespace weft
