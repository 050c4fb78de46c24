// Resume selection: walk a root's step folders newest first and take the first that passes
// every check, so that a stale, edited or corrupted newer folder costs a fallback, not a run.
#include "checkpoint/select.h"

#include <cstdio>
#include <filesystem>

#include "base/error.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

// ConfigError's text without its "field: " prefix.
std::string reason(const ConfigError& e) {
  std::string w = e.what();
  const std::string prefix = e.field() + ": ";
  return w.rfind(prefix, 0) == 0 ? w.substr(prefix.size()) : w;
}

}  // namespace

Metadata check_checkpoint(const std::string& step_dir, const std::string& field,
                          const AcceptFn& accept) {
  Metadata m = read_metadata(step_dir, field);
  if (accept) accept(m);
  verify_checkpoint(step_dir, m, field);
  return m;
}

Selection select_checkpoint(const std::string& path, const std::string& field,
                            const AcceptFn& accept) {
  Selection s;
  if (fs::exists(fs::path(path) / kMetadataFile)) {
    s.dir = path;
    s.meta = check_checkpoint(path, field, accept);
    return s;
  }
  resolve_checkpoint(path, field);  // the "does not exist" / "holds no checkpoint" errors
  std::vector<std::string> all = list_checkpoints(path);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      s.meta = check_checkpoint(*it, field, accept);
      s.dir = *it;
      return s;
    } catch (const ConfigError& e) {
      s.skipped.push_back(Skipped{*it, reason(e)});
    }
  }
  std::string msg = "no checkpoint under " + path + " can be resumed from:";
  for (const Skipped& k : s.skipped) msg += "\n  " + k.dir + ": " + k.why;
  throw ConfigError(field, msg);
}

AcceptFn same_job_as(const core::JobSpec& spec, const std::string& field) {
  return [&spec, field](const Metadata& m) {
    check_model(m, spec, field);
    if (m.seed != spec.train.seed)
      throw ConfigError(
          field, "the checkpoint was trained with train.seed " + std::to_string(m.seed) +
                     ", this job has " + std::to_string(spec.train.seed) +
                     ": data order would change; add --set train.seed=" + std::to_string(m.seed));
    if (m.global_batch != spec.train.global_batch)
      throw ConfigError(
          field, "the checkpoint was trained with train.global_batch " +
                     std::to_string(m.global_batch) + ", this job has " +
                     std::to_string(spec.train.global_batch) +
                     ": its data cursor would point elsewhere; add --set train.global_batch=" +
                     std::to_string(m.global_batch));
  };
}

void print_resume(const std::vector<Skipped>& skipped, const std::string& dir, int64_t step) {
  for (const Skipped& k : skipped)
    std::printf("resume: skipped %s: %s\n", k.dir.c_str(), k.why.c_str());
  std::printf("checkpoint: resumed from %s at step %lld\n", dir.c_str(), (long long)step);
  std::fflush(stdout);
}

}  // namespace weft::checkpoint
