// `weft ckpt`: durable checkpoints as files people move around: export the weights of a
// checkpoint to safetensors (PyTorch names), import safetensors as a step-0 checkpoint,
// and verify every shard's checksum.
#include <cstdio>

#include "base/error.h"
#include "checkpoint/trainer_state.h"
#include "core/config/job_spec.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp = R"(usage: weft ckpt <action> ...

  weft ckpt export DIR OUT.safetensors
      the parameters of the newest checkpoint under DIR (or of that step folder) as one
      safetensors file named like --save-weights (h.0.attn.qkv.weight, ...), for PyTorch
  weft ckpt import IN.safetensors DIR --config FILE.yaml [--set a.b=value ...]
      a step-0 checkpoint under DIR holding those weights (optimizer moments zero), to
      start `weft train --config FILE.yaml --resume DIR` from
  weft ckpt verify DIR
      read every shard of the newest checkpoint under DIR and check its crc32c

docs/checkpoint-format.md describes the folder layout.
)";

}  // namespace

int cmd_ckpt(const std::vector<std::string>& argv) {
  Args args(argv, {"--config", "--set"}, {"--help"}, 3);  // ACTION and its two paths
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
    std::string dir = checkpoint::import_safetensors(pos[1], pos[2], spec, "IN.safetensors");
    std::printf("wrote %s\n", dir.c_str());
    return 0;
  }
  if (action == "verify") {
    if (pos.size() != 2) throw ConfigError("weft ckpt verify", "takes DIR");
    std::string dir = checkpoint::resolve_checkpoint(pos[1], "DIR");
    checkpoint::Metadata m = checkpoint::read_metadata(dir, "DIR");
    int64_t bytes = checkpoint::verify_checkpoint(dir, m, "DIR");
    std::printf("%s: step %lld, %zu shards, %lld bytes, every crc32c matches\n", dir.c_str(),
                (long long)m.step, m.shards.size(), (long long)bytes);
    return 0;
  }
  throw ConfigError("weft ckpt", "unknown action '" + action + "'; use export, import or verify");
}

}  // namespace weft::launch
