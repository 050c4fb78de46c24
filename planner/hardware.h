// Hardware descriptions: a small YAML file (peak FLOP/s per dtype, memory bandwidth, intra- and
// inter-node links, ranks per node, device memory, the CPU-host terms) with the efficiency
// factors that turn datasheet peaks into the sustained rates the CostModel uses. The h100 and
// h200 presets ship in configs/hardware/ (compiled in); `weft calibrate` writes this
// machine's description, measured, to a cache file named after the machine (machine_cache_path).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "planner/cost.h"

namespace weft::planner {

// What names a machine for its calibration: a cache measured elsewhere (another host,
// another CPU, another OpenBLAS kernel choice) is never used here.
struct MachineKey {
  std::string host;       // gethostname
  std::string cpu_model;  // /proc/cpuinfo "model name"
  std::string openblas_coretype;  // OPENBLAS_CORETYPE, or "auto" when unset
  bool operator==(const MachineKey& o) const = default;
};
MachineKey this_machine();
// "<host>-<8 hex digits of the CPU model's hash>-<coretype>", safe as a file name.
std::string machine_id(const MachineKey& k);

// A link: peak bytes/s per rank and direction, latency in seconds per message step.
struct Link {
  double bw = 0, latency = 0, efficiency = 1;
  bool operator==(const Link& o) const = default;
};

struct Hardware {
  std::string name;    // the file's `name:`
  std::string source;  // where it came from: "preset h100", a file's path (set by the loaders)
  // Peak dense FLOP/s per device by dtype; bf16 also serves fp16.
  double flops_f32 = 0, flops_bf16 = 0;
  double flops_efficiency = 1;
  double memory_bw = 0, memory_efficiency = 1;  // bytes/s
  double memory_gib = 0;
  int ranks_per_node = 1;
  Link intra, inter;
  double launch = 0;  // fixed seconds of every collective call
  // The CPU-host terms (CostModel's cores, op_overhead, launch_oversub); 0 on GPUs.
  int cores = 0;
  double op_overhead = 0, launch_oversub = 0;
  // Sustained f32 FLOP/s by the FLOPs of one op (CostModel::flops_by_size), ascending;
  // measured by weft calibrate, empty in the presets.
  std::vector<std::pair<double, double>> flops_by_size;
  // Wire bytes/s per collective kind by call size (CostModel::coll_bw_by_size), ascending;
  // measured by weft calibrate, empty in the presets.
  std::array<std::vector<std::pair<double, double>>, kCollKinds> coll_bw_by_size;
  // Measured wait of a collective by the compute before it (CostModel::sync_wait_by_burst):
  // [burst seconds, wait seconds], ascending in burst; measured by weft calibrate, empty in
  // the presets.
  std::vector<std::pair<double, double>> sync_wait_by_burst;
  // The same where a node runs more ranks than cores (CostModel::sync_wait_oversub_by_burst,
  // replacing launch_oversub there); measured by weft calibrate, empty in the presets.
  std::vector<std::pair<double, double>> sync_wait_oversub_by_burst;
  // Ranks of the node in the probe that measured that curve, every one runnable
  // (CostModel::sync_wait_oversub_ranks); 0: not recorded (every rank of the node).
  int sync_wait_oversub_ranks = 0;
  // The same at more ranks of the node, and how many (CostModel::
  // sync_wait_oversub_more_by_burst / _ranks); measured by weft calibrate, empty in the presets.
  std::vector<std::pair<double, double>> sync_wait_oversub_more_by_burst;
  int sync_wait_oversub_more_ranks = 0;
  // Measured f32 rate of each rated op type (CostModel::op_rates); 0 where not measured.
  std::array<double, kRatedOps> op_rates{};
  // The same by the FLOPs of one op, per type (CostModel::op_rates_by_size); empty where a
  // type was timed at one shape only.
  std::array<std::vector<std::pair<double, double>>, kRatedOps> op_rates_by_size;
  // A calibration cache's machine and what was measured (for the record: the model reads
  // the fields above). Absent in the presets.
  std::optional<MachineKey> machine;
  std::vector<std::pair<std::string, double>> measurements;  // name -> seconds or rate
  std::string calibrated_at;                                  // UTC, ISO 8601

  // The CostModel of a job training in `dtype` (train.dtype: f32 | bf16): sustained rates
  // = peak x efficiency; flops_by_size only for f32 (it was measured in f32).
  CostModel cost_model(const std::string& dtype = "f32") const;
  bool operator==(const Hardware& o) const = default;
};

// Parses a description; `source` names it in errors and lands in Hardware::source.
// ConfigError naming the field (hardware.<key>) for an unknown key, a wrong type, a missing
// required key or a value out of range.
Hardware hardware_from_yaml(const std::string& text, const std::string& source);
std::string hardware_to_yaml(const Hardware& hw);

// The shipped presets' names ("h100", "h200").
std::vector<std::string> hardware_presets();
// A preset by name or a file by path. ConfigError on `field` (the flag that named it) when
// neither exists, listing the presets; ConfigError naming the key, the numbers, the fix and
// the file when its model contradicts itself (planner/description_check.h).
Hardware load_hardware(const std::string& name_or_path, const std::string& field = "--hardware");

// Where this machine's calibration lives: $WEFT_COST_CACHE if set (a file), else
// $XDG_CACHE_HOME/weft/cost-<machine_id>.yaml, else ~/.cache/weft/cost-<machine_id>.yaml.
std::string machine_cache_path(const MachineKey& k = this_machine());
// Writes `hw` (whose `machine` must be set) to `path`, creating folders, atomically.
void write_machine_cache(const Hardware& hw, const std::string& path);
// This machine's calibration, when a cache file exists at `path` and was measured on
// machine `k`; otherwise nullopt, with `why` (optional) saying what was found instead.
// A file that exists but does not parse throws ConfigError naming the path. A cache whose
// recorded collectives (calibration_check.h) or whose model (description_check.h)
// contradict themselves is not used: nullopt, and a warning naming the file and the rule.
std::optional<Hardware> read_machine_cache(const std::string& path, const MachineKey& k,
                                           std::string* why = nullptr);

// The model of a job training in `dtype` on the hardware `choice` names: a preset or a file
// (load_hardware), or, when `choice` is empty, this machine's calibration if its cache
// exists, else CostModel's defaults (a rough H100 node). `used` receives one line saying
// which (what `weft plan` prints).
CostModel choose_cost_model(const std::string& choice, const std::string& dtype, std::string* used);

}  // namespace weft::planner
