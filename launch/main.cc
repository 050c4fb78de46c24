// The `weft` binary: dispatches subcommands and maps errors to exit codes
// (0 success, 2 bad input, 1 failure at run time). Only launch/ may exit().
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "launch/commands.h"
#include "launch/error_file.h"

namespace {

struct Command {
  int (*run)(const std::vector<std::string>& args);
  const char* help;
};

const std::map<std::string, Command>& command_table() {
  static const std::map<std::string, Command> table = {
      {"train", {weft::launch::cmd_train, "train a model from a YAML config (one process, or one rank of weft run / mpirun)"}},
      {"data", {weft::launch::cmd_data, "data tools: `weft data prepare IN.txt OUT.bin`"}},
      {"snapshot-agent", {weft::launch::cmd_snapshot_agent, "the node's in-memory snapshot agent: `weft snapshot-agent --job ID --node N --socket PATH` (weft run starts it)"}},
      {"bench", {weft::launch::cmd_bench, "benchmarks: `weft bench train|memory|comm|checkpoint|scaling|store|elastic|snapshot` (`weft bench NAME --help`)"}},
      {"store", {weft::launch::cmd_store, "the rendezvous store alone: `weft store --port P [--host H]`"}},
      {"run", {weft::launch::cmd_run, "start workers on this machine: `weft run --standalone --nproc-per-node N -- weft train ...`"}},
      {"ckpt", {weft::launch::cmd_ckpt, "checkpoints: `weft ckpt export DIR out.safetensors`, `import`, `verify`"}},
      {"snapshot", {weft::launch::cmd_snapshot, "in-memory snapshots on this node: `weft snapshot ls|verify|clean [--job ID]`"}},
      {"plan", {weft::launch::cmd_plan, "plan, validate and simulate a parallel layout: `weft plan --config X.yaml --world N`"}},
      {"calibrate", {weft::launch::cmd_calibrate, "measure this machine for the planner's cost model (cached; used by weft plan and weft bench scaling)"}},
  };
  return table;
}

void usage(FILE* out) {
  std::fprintf(out, "weft %s: distributed training with elastic parallelism\n\nusage: weft <command> [args]\n\n",
               WEFT_VERSION);
  int width = 0;  // the longest command name, so that the helps line up
  for (const auto& [name, c] : command_table()) width = std::max(width, int(name.size()));
  for (const auto& [name, c] : command_table())
    std::fprintf(out, "  %-*s %s\n", width, name.c_str(), c.help);
  std::fprintf(out, "\nRun `weft <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  auto it = command_table().find(argv[1]);
  if (it == command_table().end()) {
    std::fprintf(stderr, "weft: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return it->second.run(args);
  } catch (const weft::ConfigError& e) {
    weft::launch::record_error(e);  // TORCHELASTIC_ERROR_FILE, for weft run's root cause
    std::fprintf(stderr, "weft %s: error: %s\n", argv[1], e.what());
    return 2;
  } catch (const std::bad_alloc& e) {
    weft::launch::record_error(e);
    // Whatever the allocation was, the fix is the same: a smaller job or more memory.
    std::fprintf(stderr,
                 "weft %s: failed: out of memory (%s): the job asked for more memory than this "
                 "machine gave it; shrink model.layers/model.dim or train.micro_batch, shard more "
                 "(parallel.*), or free memory on this machine\n",
                 argv[1], e.what());
    return 1;
  } catch (const std::exception& e) {
    weft::launch::record_error(e);
    std::fprintf(stderr, "weft %s: failed: %s\n", argv[1], e.what());
    return 1;
  }
}
