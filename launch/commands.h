// The subcommands of the `weft` binary. Each takes its arguments (after the
// command name) and returns an exit code; errors propagate as exceptions.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

int cmd_train(const std::vector<std::string>& args);
// The node's in-memory snapshot agent (launch/snapshot_agent.h).
int cmd_snapshot_agent(const std::vector<std::string>& args);
int cmd_data(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_store(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
// Measures this machine for the cost model and writes its cache (launch/calibration.h).
int cmd_calibrate(const std::vector<std::string>& args);
int cmd_ckpt(const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);
int cmd_snapshot(const std::vector<std::string>& args);

}  // namespace weft::launch
