// Durable sharded checkpoints: save the state of any layout (one shard file per writing
// rank, replicas written once), commit atomically, keep the last N, save in the background,
// and load into any other layout through the VPS, reading only the rows each rank needs.
//
// Folder: <root>/step-00000010/{metadata.json, shard-00000.bin, ...}. A save builds
// <root>/.tmp-step-00000010-<job id>/, fsyncs every file and the folder, renames it into
// place and fsyncs <root>: a crash at any point leaves either the old set of checkpoints or
// the new one, never a half-written step folder that a load would pick.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/finite.h"
#include "checkpoint/format.h"
#include "comm/communicator.h"
#include "core/config/job_spec.h"
#include "parallel/vps.h"

namespace weft::checkpoint {

// What a checkpoint records besides the tensors.
struct CheckpointInfo {
  const core::JobSpec* spec = nullptr;  // model hash, seed, global batch and the job YAML
  int64_t step = 0;                     // optimizer steps done
  std::string layout;                   // a description for people ("single process")
  std::string job_id;  // checkpoint/job_id.h; empty: a fresh one for this save alone
};

// The tensors of the ranks this process holds: ranks[i] holds `tensors[i]`, in the order of
// layout.ranks[ranks[i]].locals (host memory, dense).
struct HeldState {
  std::vector<int> ranks;
  std::vector<std::vector<core::Tensor>> tensors;
};

// Writes one checkpoint synchronously and returns its step folder. Each box goes to the
// shard of the rank that holds it (a replicated box to one of its holders, chosen by state
// so that replicas share the writing); scalars go to the metadata. This process must hold
// every rank that writes a box (see save_checkpoint_ranks otherwise). Afterwards retention
// runs (retention.h: only this job's older checkpoints go, the newest `keep` of them stay).
// Throws NonFiniteStateError (finite.h) naming the state and the step when a tensor holds a
// NaN or infinity, IoError on any write failure, InternalError when the held ranks do not
// cover the state; nothing is committed then and the temporary folder is gone.
std::string save_checkpoint(const std::string& root, const CheckpointInfo& info,
                            const parallel::StateSpace& space, const parallel::Layout& layout,
                            const HeldState& held, int64_t keep);

// A save by several processes, one rank each: collective over `comm`, whose ranks are the
// layout's, and `root` on a filesystem every rank sees. Each rank writes its shard into one
// temporary folder, rank 0 writes the metadata and commits once all agree that their shards
// are written; every rank returns the step folder once it is committed. An empty
// info.job_id is agreed on here (collective). When one rank fails (a non-finite value, a
// write error), the ranks agree on it: that rank throws its error, the others an IoError
// saying another rank failed, nothing is committed and the temporary folder is removed.
std::string save_checkpoint_ranks(const std::string& root, const CheckpointInfo& info,
                                  const parallel::StateSpace& space, const parallel::Layout& layout,
                                  int rank, const std::vector<core::Tensor>& locals, int64_t keep,
                                  comm::Communicator& comm);

// Saves in a background thread. save() copies the held tensors into host buffers at once
// (training may then overwrite them) after waiting for the previous save, and returns; the
// write and the commit happen on the thread. wait() blocks until the last save is
// committed and rethrows its error. Not thread-safe: one owner calls save/wait.
// `on_commit`, when set, runs on the background thread right after the commit with the step
// folder and the seconds since save() was called (the hooks print their line from it).
class AsyncSaver {
 public:
  AsyncSaver() = default;
  ~AsyncSaver();  // waits; a failure is logged, never thrown
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  void save(const std::string& root, const CheckpointInfo& info, const parallel::StateSpace& space,
            const parallel::Layout& layout, const HeldState& held, int64_t keep,
            std::function<void(const std::string&, double)> on_commit = {});
  void wait();
  std::string last_folder() const { return last_folder_; }

 private:
  std::thread worker_;
  std::exception_ptr error_;
  std::string last_folder_;
  std::unique_ptr<core::JobSpec> spec_copy_;
};

// The committed step folders under `root`, oldest first (temporary folders ignored).
std::vector<std::string> list_checkpoints(const std::string& root);

// `path` is a step folder or a root holding step folders (then the newest, unverified; see
// select.h for the newest that verifies). Throws ConfigError(field, ...) when there is none.
std::string resolve_checkpoint(const std::string& path, const std::string& field);
// Reads and checks `step_dir`/metadata.json: its format, its metadata_crc32c, and that a
// folder named step-N holds the metadata of step N. ConfigError(field) naming the file
// otherwise (an edited, damaged, renamed or version-1 checkpoint).
Metadata read_metadata(const std::string& step_dir, const std::string& field);

// Refuses a checkpoint of another model: ConfigError(field) naming both models.
void check_model(const Metadata& m, const core::JobSpec& spec, const std::string& field);

// Fills `locals` (rank `rank`'s local tensors of `layout`, allocated with its shapes) from
// the checkpoint in `step_dir`: for each destination box, the intersecting rows of the
// stored boxes are read with pread and their blocks verified against the checksums first.
// Scalars come from the metadata. Throws ConfigError(field) for a truncated or corrupted
// shard (naming the file and the bytes) and for a state the checkpoint lacks. Returns the
// bytes read from shard files (whole checksum blocks around the rows needed).
int64_t load_checkpoint(const std::string& step_dir, const Metadata& m,
                        const parallel::StateSpace& space, const parallel::Layout& layout, int rank,
                        std::vector<core::Tensor>& locals, const std::string& field);

// Reads every shard whole and checks its checksum; returns the bytes checked. With
// read_metadata, the full check of a checkpoint (what `weft ckpt verify` and --resume run).
int64_t verify_checkpoint(const std::string& step_dir, const Metadata& m, const std::string& field);

}  // namespace weft::checkpoint
