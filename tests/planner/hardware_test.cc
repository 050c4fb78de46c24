// Hardware descriptions (planner/hardware.h): the presets land in the CostModel, bad files
// are refused naming the key, a calibration cache round-trips and is used only on the machine
// that measured it, and `weft plan --hardware` predicts with the description it names.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "planner/hardware.h"
#include "planner/simulate.h"
#include "tests/planner/util.h"
#include "tests/support/run_weft.h"

namespace weft::planner {
namespace {
using test_util::config_error;

// Every test of this binary sees an empty calibration cache folder: `weft plan` without
// --hardware then uses CostModel's defaults whatever `weft calibrate` left on this machine.
class HermeticCostCache : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-planner-tests-cache-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
    ::unsetenv("WEFT_COST_CACHE");
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(files_dir());
  }
  // This process's own folder for the tests' files: two runs at once never share a file,
  // and nothing stays in the temporary directory.
  static std::filesystem::path files_dir() {
    return std::filesystem::temp_directory_path() /
           ("weft-planner-tests-files-" + std::to_string(::getpid()));
  }

 private:
  std::filesystem::path dir_;
};
const auto* const kCacheEnv = ::testing::AddGlobalTestEnvironment(new HermeticCostCache);

std::string temp_path(const std::string& name) {
  std::filesystem::create_directories(HermeticCostCache::files_dir());
  return (HermeticCostCache::files_dir() / name).string();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Hardware, PresetsLandInTheCostModel) {
  std::vector<std::string> names = hardware_presets();
  ASSERT_NE(std::find(names.begin(), names.end(), "h100"), names.end());
  ASSERT_NE(std::find(names.begin(), names.end(), "h200"), names.end());
  Hardware h100 = load_hardware("h100");
  EXPECT_EQ(h100.source, "preset h100");
  EXPECT_DOUBLE_EQ(h100.flops_bf16, 989.4e12);
  EXPECT_DOUBLE_EQ(h100.memory_bw, 3.35e12);
  EXPECT_DOUBLE_EQ(h100.intra.bw, 450e9);
  EXPECT_DOUBLE_EQ(h100.inter.bw, 50e9);
  CostModel bf16 = h100.cost_model("bf16");
  EXPECT_DOUBLE_EQ(bf16.flops, 989.4e12 * h100.flops_efficiency);
  EXPECT_DOUBLE_EQ(bf16.mem_bw, 3.35e12 * h100.memory_efficiency);
  EXPECT_DOUBLE_EQ(bf16.bw_intra, 450e9 * h100.intra.efficiency);
  EXPECT_DOUBLE_EQ(bf16.bw_inter, 50e9 * h100.inter.efficiency);
  EXPECT_DOUBLE_EQ(bf16.alpha_intra, h100.intra.latency);
  EXPECT_EQ(bf16.ranks_per_node, 8);
  EXPECT_EQ(bf16.cores, 0);  // a GPU: no CPU sharing terms
  EXPECT_LT(h100.cost_model("f32").flops, bf16.flops);  // f32 runs off the tensor cores

  Hardware h200 = load_hardware("h200");
  EXPECT_DOUBLE_EQ(h200.memory_bw, 4.8e12);
  EXPECT_GT(h200.cost_model("bf16").device_memory, bf16.device_memory);
  EXPECT_EQ(h200.flops_bf16, h100.flops_bf16);  // the same compute, more and faster memory
  // A CostModel is a cache key: the two must differ as keys.
  EXPECT_FALSE(h200.cost_model("bf16") == bf16);
}

TEST(Hardware, UnknownKeyIsNamed) {
  std::string text = hardware_to_yaml(load_hardware("h100"));
  ConfigError e = config_error([&] { hardware_from_yaml(text + "nvlink_gen: 4\n", "test.yaml"); });
  EXPECT_EQ(e.field(), "hardware.nvlink_gen");
  EXPECT_NE(std::string(e.what()).find("test.yaml"), std::string::npos) << e.what();
  e = config_error([&] {
    hardware_from_yaml(std::regex_replace(text, std::regex("latency:"), "latncy:"), "test.yaml");
  });
  EXPECT_EQ(e.field(), "hardware.intra_node.latency") << e.what();  // missing, then unknown
}

TEST(Hardware, BadValuesAreNamed) {
  const std::string text = hardware_to_yaml(load_hardware("h200"));
  auto field_of = [&](const std::string& from, const std::string& to) {
    std::string t = std::regex_replace(text, std::regex(from), to);
    EXPECT_NE(t, text) << from;
    return config_error([&] { hardware_from_yaml(t, "x.yaml"); }).field();
  };
  EXPECT_EQ(field_of("bf16: [0-9.e+]+", "bf16: fast"), "hardware.flops.bf16");
  EXPECT_EQ(field_of("flops_efficiency: [0-9.]+", "flops_efficiency: 1.5"), "hardware.flops_efficiency");
  EXPECT_EQ(field_of("ranks_per_node: 8", "ranks_per_node: 2.5"), "hardware.ranks_per_node");
  EXPECT_EQ(field_of("gib: [0-9.]+", "gib: -1"), "hardware.memory.gib");
  EXPECT_EQ(field_of("name: \"h200\"\n", ""), "hardware.name");
}

TEST(Hardware, MissingFileOrPresetIsAClearError) {
  ConfigError e = config_error([] { load_hardware("/nonexistent/b200.yaml"); });
  EXPECT_EQ(e.field(), "--hardware");
  EXPECT_NE(std::string(e.what()).find("/nonexistent/b200.yaml"), std::string::npos);
  EXPECT_NE(std::string(e.what()).find("h100, h200"), std::string::npos) << e.what();
  e = config_error([] { load_hardware("a100"); });
  EXPECT_NE(std::string(e.what()).find("neither a preset"), std::string::npos) << e.what();
}

TEST(Hardware, AFileLoadsLikeAPreset) {
  const std::string path = temp_path("weft_hw_file.yaml");
  write(path, hardware_to_yaml(load_hardware("h200")));
  Hardware f = load_hardware(path);
  EXPECT_EQ(f.source, path);
  Hardware p = load_hardware("h200");
  p.source = path;
  EXPECT_EQ(f, p);
}

Hardware calibrated(const MachineKey& k) {
  Hardware hw;
  hw.name = "calibrated";
  hw.flops_f32 = hw.flops_bf16 = 3.5e10;
  hw.memory_bw = 9.5e9, hw.memory_gib = 23.4;
  hw.ranks_per_node = 1 << 20;
  hw.intra = {2.1e9, 31e-6, 1}, hw.inter = hw.intra;
  hw.launch = 45e-6;
  hw.cores = 2, hw.op_overhead = 6.5e-6, hw.launch_oversub = 120e-6;
  hw.flops_by_size = {{1e5, 5e9}, {1e7, 2e10}, {1e9, 3.5e10}};
  hw.machine = k;
  hw.calibrated_at = "2026-12-03T09:00:00Z";
  hw.measurements = {{"gemm_64x128x32", 4.9e9}, {"gloo_n2_ar_4B", 7.7e-5}};
  return hw;
}

TEST(Hardware, CalibrationCacheRoundTrip) {
  const MachineKey here = this_machine();
  const std::string path = temp_path("weft_cache_dir/sub/cost.yaml");
  std::filesystem::remove_all(temp_path("weft_cache_dir"));
  Hardware hw = calibrated(here);
  write_machine_cache(hw, path);
  std::optional<Hardware> back = read_machine_cache(path, here);
  ASSERT_TRUE(back.has_value());
  hw.source = path;
  EXPECT_EQ(*back, hw);
  CostModel m = back->cost_model("f32");
  EXPECT_EQ(m.flops_by_size, hw.flops_by_size);
  EXPECT_EQ(m.cores, 2);
  EXPECT_DOUBLE_EQ(m.op_overhead, 6.5e-6);
  EXPECT_DOUBLE_EQ(m.launch_oversub, 120e-6);
  // The measured curve: small ops run at the small rate, large at the large one.
  EXPECT_DOUBLE_EQ(m.flop_rate(1e3), 5e9);
  EXPECT_DOUBLE_EQ(m.flop_rate(1e8), (2e10 + 3.5e10) / 2);  // halfway in log(FLOPs)
  EXPECT_DOUBLE_EQ(m.flop_rate(1e12), 3.5e10);
  EXPECT_GT(m.compute(1e5, 0), 1e5 / 3.5e10);
}

TEST(Hardware, ACacheOfAnotherMachineIsNotUsed) {
  const MachineKey here = this_machine();
  for (int which = 0; which < 3; ++which) {
    MachineKey other = here;
    (which == 0 ? other.host : which == 1 ? other.cpu_model : other.openblas_coretype) += "-other";
    EXPECT_NE(machine_id(other), machine_id(here)) << which;
    const std::string path = temp_path("weft_other_cache.yaml");
    write_machine_cache(calibrated(other), path);
    std::string why;
    EXPECT_FALSE(read_machine_cache(path, here, &why).has_value()) << which;
    EXPECT_NE(why.find("not this machine"), std::string::npos) << why;
  }
  std::string why;
  EXPECT_FALSE(read_machine_cache(temp_path("weft_no_such_cache.yaml"), here, &why).has_value());
  EXPECT_NE(why.find("weft calibrate"), std::string::npos) << why;
}

TEST(Hardware, ThePlanUsesThisMachinesCacheUnlessToldOtherwise) {
  const std::string dir = temp_path("weft_xdg");
  std::filesystem::remove_all(dir);
  const std::string saved = std::getenv("XDG_CACHE_HOME") ? std::getenv("XDG_CACHE_HOME") : "";
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  const std::string path = machine_cache_path();
  EXPECT_EQ(path.rfind(dir + "/weft/cost-" + machine_id(this_machine()) + ".yaml", 0), 0u) << path;
  std::string used;
  CostModel none = choose_cost_model("", "f32", &used);
  EXPECT_TRUE(none == CostModel{});
  EXPECT_NE(used.find("built-in defaults"), std::string::npos) << used;
  write_machine_cache(calibrated(this_machine()), path);
  CostModel mine = choose_cost_model("", "f32", &used);
  EXPECT_EQ(mine.cores, 2);
  EXPECT_NE(used.find(path), std::string::npos) << used;
  CostModel h200 = choose_cost_model("h200", "bf16", &used);
  EXPECT_EQ(h200, load_hardware("h200").cost_model("bf16"));
  EXPECT_NE(used.find("preset h200"), std::string::npos) << used;
  ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

// ---- weft plan --hardware ----

double predicted_ms(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex("predicted step ([0-9.]+) ms"))) << out;
  return m.empty() ? -1 : std::stod(m[1]);
}

std::string config(const std::string& name) { return std::string(WEFT_SOURCE_DIR) + "/configs/" + name; }

TEST(Hardware, PlanWithH200PredictsFasterThanH100WhereMemoryBound) {
  // GPT-2 124M in bf16 at micro-batch 1: its elementwise ops and optimizer are memory-bound,
  // so H200's faster HBM (4.8 vs 3.35 TB/s) at the same FLOP rate and links must shorten the
  // step, and nothing may lengthen it.
  const std::string base = "plan --config " + config("gpt2-124m-plan.yaml") +
                           " --world 8 --set train.dtype=bf16 --set train.micro_batch=1 --hardware ";
  test::CommandResult h100 = test::run_weft(base + "h100"), h200 = test::run_weft(base + "h200");
  ASSERT_EQ(h100.code, 0) << h100.out;
  ASSERT_EQ(h200.code, 0) << h200.out;
  EXPECT_NE(h100.out.find("cost model: hardware preset h100 (h100), bf16 rates"), std::string::npos) << h100.out;
  EXPECT_NE(h200.out.find("cost model: hardware preset h200 (h200), bf16 rates"), std::string::npos) << h200.out;
  // Both are the cost model's predictions (no clock runs): the h200 file's faster memory
  // (4.8 against 3.35 TB/s, the same FLOP/s) must reach the prediction of a memory-bound job.
  EXPECT_LT(predicted_ms(h200.out), predicted_ms(h100.out));
  EXPECT_NE(h200.out.find("of 139.00 GiB per device"), std::string::npos) << h200.out;
  EXPECT_NE(h100.out.find("of 79.60 GiB per device"), std::string::npos) << h100.out;
}

TEST(Hardware, PlanNamesTheModelAndRefusesAnUnknownOne) {
  const std::string base = "plan --config " + config("gpt2-124m-plan.yaml") + " --world 8";
  test::CommandResult r = test::run_weft(base);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cost model: built-in defaults"), std::string::npos) << r.out;
  r = test::run_weft(base + " --hardware h100 --flops 1e14");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("set by flags: --flops"), std::string::npos) << r.out;
  r = test::run_weft(base + " --hardware b300");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--hardware"), std::string::npos) << r.out;
  const std::string bad = temp_path("weft_bad_hw.yaml");
  write(bad, hardware_to_yaml(load_hardware("h100")) + "pcie: 64e9\n");
  r = test::run_weft(base + " --hardware " + bad);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("hardware.pcie"), std::string::npos) << r.out;
}

// `weft calibrate` end to end (it starts 2 and 4 processes for the Gloo probe): its file
// parses, names this machine, carries the measured curve, and weft plan predicts with it.
// The consistency rules are loosened for it (WEFT_TEST_COLLECTIVE_SPREAD): under the suite's
// load a real probe may contradict itself through every re-measure, and this test is about
// the file; the rules and the refusal have their own tests (CalibrationCheck.*,
// CalibrationRecheck.*).
TEST(Hardware, CalibrateWritesACacheThatPlanUses) {
  const std::string path = temp_path("weft_calibrated.yaml");
  std::filesystem::remove(path);
  // Loosened here too: this process reads the cache back (read_machine_cache checks it).
  ::setenv("WEFT_TEST_COLLECTIVE_SPREAD", "1e9", 1);
  struct Unset {
    ~Unset() { ::unsetenv("WEFT_TEST_COLLECTIVE_SPREAD"); }
  } unset;
  test::CommandResult r = test::run_command("WEFT_TEST_COLLECTIVE_SPREAD=1e9 " +
                                            std::string(WEFT_BINARY) + " calibrate --out " + path);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* progress : {"memory: memcpy", "gemm 64x128x32", "gloo, 2 processes", "gloo, 4 processes", "link fit over",
                               "collective wire rates", "op rates", "executor:", "wrote " })
    EXPECT_NE(r.out.find(progress), std::string::npos) << progress << "\n" << r.out;
  std::optional<Hardware> hw = read_machine_cache(path, this_machine());
  ASSERT_TRUE(hw.has_value());
  EXPECT_EQ(hw->flops_by_size.size(), 5u);  // six shapes, two of equal FLOPs
  EXPECT_GT(hw->cores, 0);
  EXPECT_GT(hw->memory_bw, 0);
  EXPECT_GT(hw->intra.bw, 0);
  // Gloo's 4 MiB reduce-scatter (an all-reduce of the whole buffer) always takes longer than
  // the fixed part, the small GPT runs every GPT kernel, the small Llama every Llama one and
  // the MoE layout model the MoE layer.
  EXPECT_FALSE(hw->coll_bw_by_size[size_t(CollKind::kReduceScatter)].empty());
  // Above the cores: the first curve at 4 processes and the one at 8 (this machine's cores
  // permitting), with the ranks of each probe.
  if (hw->cores < 4) {
    EXPECT_NE(r.out.find("gloo, 8 processes"), std::string::npos) << r.out;
    EXPECT_EQ(hw->sync_wait_oversub_ranks, 4);
    EXPECT_FALSE(hw->sync_wait_oversub_by_burst.empty());
    EXPECT_EQ(hw->sync_wait_oversub_more_ranks, 8);
    EXPECT_FALSE(hw->sync_wait_oversub_more_by_burst.empty());
  }
  for (const char* type : {"attention", "attention.bwd", "layernorm", "gelu.bwd", "cross_entropy",
                           "adamw", "rmsnorm", "rmsnorm.bwd", "rope", "rope.bwd", "swiglu",
                           "swiglu.bwd", "gqa_attention", "gqa_attention.bwd", "moe", "moe.bwd"})
    EXPECT_GT(hw->op_rates[size_t(rated_op(type))], 0) << type;
  CostModel m = hw->cost_model("f32");
  EXPECT_FALSE(m == CostModel{});
  r = test::run_weft("plan --config " + config("gpt-layout.yaml") + " --world 2 --set parallel.dp=2");
  EXPECT_NE(r.out.find("cost model: built-in defaults"), std::string::npos) << r.out;  // the test's empty cache
  r = test::run_command("WEFT_TEST_COLLECTIVE_SPREAD=1e9 WEFT_COST_CACHE=" + path + " " +
                        std::string(WEFT_BINARY) + " plan --config " + config("gpt-layout.yaml") +
                        " --world 2 --set parallel.dp=2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cost model: this machine's calibration " + path), std::string::npos) << r.out;
}

}  // namespace
}  // namespace weft::planner
