// `weft snapshot-agent`: its command line (launch/snapshot_agent.h is the agent).
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/host.h"
#include "checkpoint/snapshot_segment.h"
#include "checkpoint/snapshot_transport.h"
#include "launch/args.h"
#include "launch/commands.h"
#include "launch/snapshot_agent.h"

namespace weft::launch {

namespace ckpt = checkpoint;

namespace {

constexpr const char* kHelp =
    R"(usage: weft snapshot-agent --job ID --node N --socket PATH [--listen HOST:PORT]

The node's in-memory snapshot agent (weft run starts one per node for jobs with
snapshot.every > 0; it can also run alone). It owns the job's shared-memory segments
(/dev/shm/weft-snap-ID-*), so that they survive the workers; workers talk to it over the
Unix socket PATH (WEFT_SNAPSHOT_SOCKET), one JSON request per line.

  --job ID       the job id (16 hex digits; weft run: from the run id)
  --node N       this node's index (segment names; which segments a restart adopts)
  --socket PATH  the Unix socket to serve
  --abandoned-after S  other jobs' segments whose owner is gone are removed at start once
                 older than S whole seconds (default 60), unless their guardian lives
  --guardian PID the process that restarts this agent when it dies (weft run passes its
                 own pid; default: the agent's parent, none when that is init), recorded in
                 its segments: another agent keeps a dead agent's segments while it lives
  --listen HOST:PORT  accept other nodes' agents on TCP (port 0: any free one; the request
                 `endpoint` says which): snapshot.redundancy replica or ec. The job token
                 (WEFT_JOB_TOKEN or WEFT_JOB_TOKEN_FILE) authenticates them both ways
  --redundancy none|replica|ec  replica: copies of the next node's snapshots; ec: parity
                 of the group's snapshots (Reed-Solomon, ISA-L); reserve counts either
  --ec-k K, --ec-m M  ec's data and parity fragments per stripe (default 2 and 1)
  --insecure     without a job token, accept peers from other machines too
  --lock-fd FD   the agent lock of the job and node, already taken by the process that
                 starts the agent (weft run: its choice of the node's index and the lock are
                 one step); default: the agent takes it itself

At start it adopts the job's segments of this node and removes those of abandoned jobs.
SIGTERM or SIGINT: exit 0 keeping the segments; the request `finish` removes them.
)";

}  // namespace

int cmd_snapshot_agent(const std::vector<std::string>& argv) {
  Args args(argv,
            {"--job", "--node", "--socket", "--abandoned-after", "--guardian", "--listen",
             "--redundancy", "--ec-k", "--ec-m", "--lock-fd"},
            {"--help", "--insecure"});
  if (args.flag("--help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  SnapshotAgentOptions o;
  o.job_id = args.required("--job");
  if (!ckpt::valid_job_id(o.job_id))
    throw ConfigError("--job",
                      "must be 16 lowercase hex digits (a job id), got '" + o.job_id + "'");
  o.node = int(args.get_int("--node", -1));
  if (!args.has("--node") || o.node < 0)
    throw ConfigError("--node", "is required and must be >= 0");
  o.socket = args.required("--socket");
  o.abandoned_after_s = double(args.get_int("--abandoned-after", 60));
  if (o.abandoned_after_s < 0) throw ConfigError("--abandoned-after", "must be >= 0 seconds");
  // Without --guardian the parent is the supervisor: it restarts the agent, if anyone does.
  // Pid 1 (init, or a container's) adopts orphans and restarts nothing: no guardian then.
  const pid_t parent = ::getppid();
  o.guardian_pid = int(args.get_int("--guardian", parent > 1 ? parent : 0));
  if (o.guardian_pid < 0) throw ConfigError("--guardian", "must be a pid, or 0 for none");
  o.listen = args.get_or("--listen", "");
  if (!o.listen.empty()) {
    try {
      split_endpoint(o.listen);
    } catch (const std::invalid_argument& e) {
      throw ConfigError("--listen", e.what());
    }
  }
  o.redundancy = args.get_or("--redundancy", "none");
  if (o.redundancy != "none" && o.redundancy != "replica" && o.redundancy != "ec")
    throw ConfigError("--redundancy", "must be none, replica or ec, got '" + o.redundancy + "'");
  o.ec_k = int(args.get_int("--ec-k", 2));
  o.ec_m = int(args.get_int("--ec-m", 1));
  if (o.ec_k < 1 || o.ec_m < 1 || o.ec_k + o.ec_m > 255)
    throw ConfigError("--ec-k", "--ec-k and --ec-m must be >= 1 with a sum of at most 255");
  o.insecure = args.flag("--insecure");
  o.lock_fd = int(args.get_int("--lock-fd", -1));
  if (args.has("--lock-fd") && o.lock_fd < 0)
    throw ConfigError("--lock-fd",
                      "must be an open descriptor (>= 0), got " + std::to_string(o.lock_fd));
  return run_snapshot_agent(o);
}

}  // namespace weft::launch
