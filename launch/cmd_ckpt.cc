// `weft ckpt`: durable checkpoints as files people move around: export the weights of a
// checkpoint to safetensors (PyTorch names), import safetensors as a step-0 checkpoint,
// and verify checkpoints (metadata checksum, folder step, every shard's checksum).
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "checkpoint/select.h"
#include "checkpoint/trainer_state.h"
#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp = R"(usage: weft ckpt <action> ...

  weft ckpt export DIR OUT.safetensors
      the parameters of the newest checkpoint under DIR that verifies (or of that step
      folder) as one safetensors file named like --save-weights (h.0.attn.qkv.weight, ...)
  weft ckpt import IN.safetensors DIR --config FILE.yaml [--set a.b=value ...] [--force]
      a step-0 checkpoint under DIR holding those weights (optimizer moments zero), to
      start `weft train --config FILE.yaml --resume DIR` from. DIR must be new or empty
      unless --force (then resume from DIR/step-00000000 by name)
  weft ckpt verify DIR
      check a step folder, or every step folder under DIR: the metadata's own checksum,
      that the folder's step is the metadata's, and every shard's crc32c. Exit 2 naming
      each checkpoint that fails

docs/checkpoint-format.md describes the folder layout.
)";

}  // namespace

int cmd_ckpt(const std::vector<std::string>& argv) {
  Args args(argv, {"--config", "--set"}, {"--help", "--force"}, 3);  // ACTION and its two paths
  const std::vector<std::string>& pos = args.positional();
  if (args.flag("--help") || pos.empty()) {
    std::fputs(kHelp, pos.empty() && !args.flag("--help") ? stderr : stdout);
    return args.flag("--help") ? 0 : 2;
  }
  const std::string& action = pos[0];
  if (action == "export") {
    if (pos.size() != 3) throw ConfigError("weft ckpt export", "takes DIR OUT.safetensors");
    int64_t n = checkpoint::export_safetensors(pos[1], pos[2], "DIR");
    std::printf("wrote %lld tensors to %s\n", (long long)n, pos[2].c_str());
    return 0;
  }
  if (action == "import") {
    if (pos.size() != 3)
      throw ConfigError("weft ckpt import", "takes IN.safetensors DIR --config FILE.yaml");
    core::JobSpec spec = core::load_job_spec(args.required("--config"), args.all("--set"));
    std::string dir = checkpoint::import_safetensors(pos[1], pos[2], spec, "IN.safetensors",
                                                     args.flag("--force"));
    std::printf("wrote %s\n", dir.c_str());
    if (checkpoint::list_checkpoints(pos[2]).back() != dir)
      std::printf("note: %s holds newer checkpoints; resume from this one by name: --resume %s\n",
                  pos[2].c_str(), dir.c_str());
    return 0;
  }
  if (action == "verify") {
    if (pos.size() != 2) throw ConfigError("weft ckpt verify", "takes DIR");
    const std::string& path = pos[1];
    std::vector<std::string> dirs;
    if (std::filesystem::exists(std::filesystem::path(path) / checkpoint::kMetadataFile))
      dirs = {path};
    else
      checkpoint::resolve_checkpoint(path, "DIR"), dirs = checkpoint::list_checkpoints(path);
    std::string failed;
    for (const std::string& dir : dirs) {
      try {
        checkpoint::Metadata m = checkpoint::read_metadata(dir, "DIR");
        int64_t bytes = checkpoint::verify_checkpoint(dir, m, "DIR");
        std::printf(
            "%s: step %lld, job %s, %zu shards, %lld bytes, metadata and every crc32c "
            "match\n",
            dir.c_str(), (long long)m.step, m.job_id.c_str(), m.shards.size(), (long long)bytes);
      } catch (const ConfigError& e) {
        std::printf("%s: FAILED\n", dir.c_str());
        failed += std::string("\n  ") + e.what();
      }
    }
    std::fflush(stdout);
    if (!failed.empty())
      throw ConfigError("DIR",
                        "checkpoints that fail verification (remove them or resume from "
                        "an older one):" +
                            failed);
    return 0;
  }
  throw ConfigError("weft ckpt", "unknown action '" + action + "'; use export, import or verify");
}

}  // namespace weft::launch
