// Choosing the checkpoint to resume from: under a root, the newest step folder that passes
// the full check (metadata checksum and folder step, every shard's crc32c, and the caller's
// compatibility checks), with the reason each newer one was skipped.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace weft::checkpoint {

struct Skipped {
  std::string dir;  // the step folder
  std::string why;  // the refusal, without the field name
};

struct Selection {
  std::string dir;               // the step folder chosen
  Metadata meta;                 // its metadata, checked
  std::vector<Skipped> skipped;  // newer step folders refused, newest first
};

// `accept` may throw ConfigError to refuse a checkpoint (another model, seed, batch).
using AcceptFn = std::function<void(const Metadata&)>;

// `path` names one step folder: it is checked and any refusal throws ConfigError(field)
// (no fallback). `path` is a root: its step folders from newest to oldest, the first one
// that passes wins; ConfigError(field) listing every refusal when none does, or when
// there is none. Reads every shard of each candidate whole.
Selection select_checkpoint(const std::string& path, const std::string& field,
                            const AcceptFn& accept = {});

// The full check of one step folder (read_metadata, accept, verify_checkpoint); returns
// the metadata. ConfigError(field) on any refusal.
Metadata check_checkpoint(const std::string& step_dir, const std::string& field,
                          const AcceptFn& accept = {});

// Refuses another model, train.seed or train.global_batch (ConfigError(field) naming the
// key and the value to set): the checks every resume makes.
AcceptFn same_job_as(const core::JobSpec& spec, const std::string& field);

// The lines a resume prints (rank 0 or the single process) on stdout:
// "resume: skipped <dir>: <why>" for each skipped folder, then
// "checkpoint: resumed from <dir> at step N".
void print_resume(const std::vector<Skipped>& skipped, const std::string& dir, int64_t step);

}  // namespace weft::checkpoint
