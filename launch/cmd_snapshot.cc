// `weft snapshot`: inspect and clean the in-memory snapshot segments of this node: list
// them with their owner's state, recompute every committed slot's checksums, and remove
// the abandoned segments: their owner (the snapshot agent) is gone and so is its guardian
// (the weft run that would restart it). docs/snapshot-format.md.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/snapshot_agent_files.h"
#include "checkpoint/snapshot_segment.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace weft::launch {
namespace {

using checkpoint::SnapshotSegment;

constexpr const char* kHelp = R"(usage: weft snapshot <action> [--job ID] ...

  weft snapshot ls [--job ID]
      the snapshot segments in /dev/shm (of one job): kind, owner node, epoch, rank/world
      and step of the newest committed snapshot, its payload, the owner pid and whether
      that process is alive, and its guardian's (the weft run that restarts the owner)
  weft snapshot verify [--job ID]
      recompute the crc32c of every block of every committed snapshot; exit 1 naming the
      corrupt blocks (or unreadable segments)
  weft snapshot clean [--job ID] [--all]
      remove the abandoned segments: their owner process is gone (a killed agent) and so
      is its guardian (while that lives it restarts the agent, which takes them over).
      --all removes live ones too: a running job loses its in-memory snapshots. Also
      removes the sockets (<tmp>/weft-snapshot-*.sock) and locks (/dev/shm/weft-agent-*)
      that killed agents left; a live agent's are kept, --all or not

ID is a job id, 16 hex digits, as in the segment names. docs/snapshot-format.md describes
the segments.
)";

const char* kind_name(checkpoint::SegmentKind k) {
  switch (k) {
    case checkpoint::SegmentKind::kData:
      return "data";
    case checkpoint::SegmentKind::kReplica:
      return "replica";
    case checkpoint::SegmentKind::kParity:
      return "parity";
    case checkpoint::SegmentKind::kRebuilt:
      return "rebuilt";
  }
  return "?";
}

std::string job_of(const Args& args) {
  std::string job = args.get_or("--job", "");
  if (args.has("--job") && !checkpoint::valid_job_id(job))
    throw ConfigError("--job", "'" + job +
                                   "' is not a job id: 16 lowercase hex digits, as in the "
                                   "names `weft snapshot ls` shows");
  return job;
}

std::string of_job(const std::string& job) { return job.empty() ? "" : " of job " + job; }

// " (guardian pid P alive)", or "" when the segment records none.
std::string guardian_text(const SnapshotSegment& s) {
  if (s.guardian_pid() <= 0) return "";
  return " (guardian pid " + std::to_string(s.guardian_pid()) +
         (s.guardian_gone() ? " gone)" : " alive)");
}

int ls(const std::string& job) {
  std::vector<std::string> names = checkpoint::snapshot_segments(job);
  if (names.empty()) {
    std::printf("no snapshot segments%s in /dev/shm\n", of_job(job).c_str());
    return 0;
  }
  std::printf("%-44s %-7s %4s %5s %10s %8s %11s %s\n", "NAME", "KIND", "NODE", "EPOCH",
              "RANK/WORLD", "STEP", "PAYLOAD MiB", "OWNER");
  int gone = 0, guarded = 0;
  for (const std::string& n : names) {
    try {
      SnapshotSegment s = SnapshotSegment::open(n, false);
      std::optional<SnapshotSegment::View> v = s.latest();
      std::optional<checkpoint::SegmentName> p = checkpoint::parse_segment_name(n);
      bool dead = s.owner_gone();
      gone += dead;
      guarded += dead && !s.abandoned();
      std::string kind = v ? kind_name(v->meta.kind) : p ? kind_name(p->kind) : "?";
      std::string node = v   ? std::to_string(v->meta.owner_node)
                         : p ? std::to_string(p->owner_node)
                             : "?";
      std::string epoch = v ? std::to_string(v->meta.epoch) : p ? std::to_string(p->epoch) : "?";
      std::string rank = v   ? std::to_string(v->meta.rank) + "/" + std::to_string(v->meta.world)
                         : p ? std::to_string(p->rank) + "/?"
                             : "?";
      std::string step = v ? std::to_string(v->meta.step) : "-";
      char mib[32] = "-";
      if (v) std::snprintf(mib, sizeof mib, "%.1f", double(v->meta.payload_bytes) / (1 << 20));
      std::printf("%-44s %-7s %4s %5s %10s %8s %11s %d %s%s\n", n.c_str(), kind.c_str(),
                  node.c_str(), epoch.c_str(), rank.c_str(), step.c_str(), mib, s.owner_pid(),
                  dead ? "gone" : "alive", guardian_text(s).c_str());
    } catch (const IoError& e) {
      std::printf("%-44s unreadable: %s\n", n.c_str(), e.what());
    }
  }
  std::printf("%zu segments%s", names.size(), of_job(job).c_str());
  if (gone && !guarded)
    std::printf(", %d with their owner gone (`weft snapshot clean` removes them)", gone);
  else if (gone)
    std::printf(
        ", %d with their owner gone, %d of them kept for the restart their live guardian makes "
        "(`weft snapshot clean` removes the other %d)",
        gone, guarded, gone - guarded);
  std::printf("\n");
  return 0;
}

int verify(const std::string& job) {
  std::vector<std::string> names = checkpoint::snapshot_segments(job);
  if (names.empty()) {
    std::printf("no snapshot segments%s in /dev/shm\n", of_job(job).c_str());
    return 0;
  }
  int failed = 0;
  for (const std::string& n : names) {
    try {
      SnapshotSegment s = SnapshotSegment::open(n, false);
      std::string report;
      bool bad = false;
      for (int slot = 0; slot < s.slots(); ++slot) {
        std::optional<SnapshotSegment::View> v = s.slot(slot);
        if (!v) continue;
        std::vector<int64_t> corrupt = s.corrupt_blocks(*v);
        report += "; slot " + std::to_string(slot) + " step " + std::to_string(v->meta.step);
        if (s.sequence(slot) != v->meta.sequence) {
          report += ": rewritten while verifying, not checked";
        } else if (!corrupt.empty()) {
          bad = true;
          report += ": " + std::to_string(corrupt.size()) + " corrupt block" +
                    (corrupt.size() > 1 ? "s" : "") + " at";
          for (size_t i = 0; i < corrupt.size() && i < 16; ++i)
            report += (i ? ", " : " ") + std::to_string(corrupt[i]);
          if (corrupt.size() > 16) report += ", ...";
        }
      }
      if (report.empty()) report = "; no committed snapshot";
      std::printf("%s: %s (%s)\n", n.c_str(), bad ? "CORRUPT" : "ok", report.c_str() + 2);
      failed += bad;
    } catch (const IoError& e) {
      std::printf("%s: UNREADABLE %s\n", n.c_str(), e.what());
      ++failed;
    }
  }
  if (failed) {
    std::printf("%d of %zu segments%s failed verification\n", failed, names.size(),
                of_job(job).c_str());
    return 1;
  }
  std::printf("%zu segments%s verified\n", names.size(), of_job(job).c_str());
  return 0;
}

int clean(const std::string& job, bool all) {
  std::vector<std::string> names = checkpoint::snapshot_segments(job);
  int removed = 0, kept = 0, live_removed = 0;
  for (const std::string& n : names) {
    std::string why;
    bool remove = all;
    try {
      SnapshotSegment s = SnapshotSegment::open(n, false);
      // Abandoned: the owner is gone and so is its guardian. A dead owner whose guardian
      // lives is about to be restarted and to take the segment over: not removed.
      const bool gone = s.abandoned();
      why = "owner pid " + std::to_string(s.owner_pid()) + (s.owner_gone() ? " gone" : " alive") +
            guardian_text(s);
      remove = remove || gone;
      if (remove && !gone) why += ": not abandoned, removed by --all";
      live_removed += remove && !gone;
    } catch (const IoError& e) {
      // A segment being created has no header yet: never removed on a guess.
      why = std::string("unreadable: ") + e.what();
    }
    if (!remove) {
      ++kept;
      std::printf("kept    %s (%s)\n", n.c_str(), why.c_str());
      continue;
    }
    SnapshotSegment::unlink(n);
    ++removed;
    std::printf("removed %s (%s)\n", n.c_str(), why.c_str());
  }
  std::fflush(stdout);
  if (live_removed)
    std::fprintf(stderr,
                 "weft snapshot clean: WARNING: --all removed %d segment%s whose owner or its "
                 "guardian is ALIVE: a running job lost its in-memory snapshots\n",
                 live_removed, live_removed > 1 ? "s" : "");
  const std::vector<std::string> files = checkpoint::remove_stale_agent_files(job);
  for (const std::string& f : files)
    std::printf("removed %s (no snapshot agent holds it)\n", f.c_str());
  std::printf("removed %d snapshot segment%s%s", removed, removed == 1 ? "" : "s",
              of_job(job).c_str());
  if (!files.empty())
    std::printf(" and %zu file%s killed agents left", files.size(), files.size() == 1 ? "" : "s");
  if (kept)
    std::printf("; kept %d (owner or its guardian alive, or unreadable; --all removes them too)",
                kept);
  std::printf("\n");
  return 0;
}

}  // namespace

int cmd_snapshot(const std::vector<std::string>& argv) {
  Args args(argv, {"--job"}, {"--help", "--all"}, 1);  // the action
  const std::vector<std::string>& pos = args.positional();
  if (args.flag("--help") || pos.empty()) {
    std::fputs(kHelp, pos.empty() && !args.flag("--help") ? stderr : stdout);
    return args.flag("--help") ? 0 : 2;
  }
  const std::string& action = pos[0];
  if (action != "ls" && action != "verify" && action != "clean")
    throw ConfigError("weft snapshot", "unknown action '" + action + "'; use ls, verify or clean");
  if (args.flag("--all") && action != "clean")
    throw ConfigError("--all", "only `weft snapshot clean` takes it");
  std::string job = job_of(args);
  if (action == "ls") return ls(job);
  if (action == "verify") return verify(job);
  return clean(job, args.flag("--all"));
}

}  // namespace weft::launch
