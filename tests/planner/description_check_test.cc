// The rules of a hardware description's model (planner/description_check.h), on the presets
// and on files written by hand: the presets, a consistent CPU host's file and the suite's
// calibration (tests/support/test_calibration.h) pass; each rule
// broken is refused where a file is loaded (load_hardware: `weft plan --hardware`), naming the
// key, the numbers, the fix and the file; a calibration cache whose model breaks one is not
// used (read_machine_cache), and plans fall back to the defaults.
#include "planner/description_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "planner/hardware.h"
#include "tests/planner/util.h"
#include "tests/support/run_weft.h"
#include "tests/support/test_calibration.h"

namespace weft::planner {
namespace {
using test_util::config_error;

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// This test's own folder, removed at its end.
struct Folder {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("weft-description-check-" + std::to_string(::getpid()));
  Folder() { std::filesystem::create_directories(dir); }
  ~Folder() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  }
};

// A CPU host's description as `weft calibrate` fits it on this project's 2-core VM (the
// figures of its 2026-12-06 04:01 calibration, rounded), written without measurements.
const std::string kCpuHost = R"(name: cpu host
flops: {f32: 3.0e10, bf16: 3.0e10}
memory: {bw: 1.6e10, gib: 23.6}
ranks_per_node: 1048576
intra_node: {bw: 3.8e9, latency: 4.4e-5}
inter_node: {bw: 3.8e9, latency: 4.4e-5}
launch: 1.66e-4
cpu: {cores: 2, op_overhead: 2.2e-6, launch_oversub: 2.4e-4}
flops_by_size: [[524288, 2.0e10], [4194304, 2.87e10], [33554432, 3.0e10], [268435456, 2.87e10], [1073741824, 2.46e10]]
collective_bw_by_size:
  all_reduce: [[1048576, 2.7e9], [4194304, 1.4e9]]
  all_gather: [[1048576, 6.0e9], [4194304, 1.9e9]]
  reduce_scatter: [[65536, 5.2e8], [262144, 7.5e8], [1048576, 8.6e8], [4194304, 6.3e8]]
op_rates_by_size:
  attention: [[151552, 3.4e9], [34865152, 2.5e10]]
  layernorm: [[16384, 7.3e9], [524288, 1.46e10]]
  embedding: [[8256, 6.2e9], [8768, 5.6e9], [33280, 1.0e9], [49664, 1.3e9]]
  global_norm: [[82240, 7.2e9], [169088, 8.5e9], [869632, 5.6e9], [891904, 5.5e9]]
)";

TEST(DescriptionCheck, ThePresetsAndAConsistentCpuHostPass) {
  for (const std::string& p : hardware_presets()) {
    const std::vector<DescriptionContradiction> found = check_description(load_hardware(p));
    EXPECT_TRUE(found.empty()) << p << ": " << describe(found);
  }
  const Folder f;
  const std::string path = f.write("cpu.yaml", kCpuHost);
  const Hardware hw = load_hardware(path);
  EXPECT_EQ(hw.cores, 2);
  EXPECT_FALSE(hw.coll_bw_by_size[0].empty());
  EXPECT_TRUE(check_description(hw).empty()) << describe(check_description(hw));
  // The suite's calibration (its small all-reduces 1.3-1.4x their reduce-scatter +
  // all-gather) loads too.
  const auto suite = check_description(test::cpu_host_calibration());
  EXPECT_TRUE(suite.empty()) << describe(suite);
}

// The field a broken file is refused with, and its message, loading it by path.
ConfigError refusal(const Folder& f, const std::string& text) {
  const std::string path = f.write("bad.yaml", text);
  return config_error([&] { load_hardware(path); });
}

TEST(DescriptionCheck, AnAllReducePricedAboveItsReduceScatterAndAllGatherIsRefused) {
  const Folder f;
  // h100's links price a 64 KiB reduce-scatter and all-gather at 11 us each; an all-reduce
  // at 1e8 B/s is 667 us, 30x (and a 5.66 KiB one 3.2x, the first size judged that breaks it).
  const ConfigError e = refusal(f, hardware_to_yaml(load_hardware("h100")) +
                                       "collective_bw_by_size: {all_reduce: [[65536, 1.0e8]]}\n");
  EXPECT_EQ(e.field(), "hardware.collective_bw_by_size.all_reduce");
  for (const std::string w :
       {std::string(kDecompositionRule), std::string("at 2 processes"),
        std::string("the 5.66KiB all-reduce is priced at 69.9 us"), std::string("allowed 1.50x"),
        std::string("fix: raise the all-reduce's rate"), (f.dir / "bad.yaml").string()})
    EXPECT_TRUE(mentions(e.what(), w)) << w << " in: " << e.what();
  // A slow all-reduce that stays below the two (16 us at 64 KiB against 22, up to the link's
  // rate at 4 MiB) passes.
  EXPECT_NO_THROW(load_hardware(
      f.write("ok.yaml",
              hardware_to_yaml(load_hardware("h100")) +
                  "collective_bw_by_size: {all_reduce: [[65536, 1.6e10], [4194304, 3.6e11]]}\n")));
}

TEST(DescriptionCheck, ACurveThatMakesALargerCallCheaperIsRefused) {
  const Folder f;
  const std::string h100 = hardware_to_yaml(load_hardware("h100"));
  // The all-gather's rate grows 2000x over 64x the bytes: the 4 MiB call is priced at 22 us,
  // the 64 KiB one 339 us (and the first size judged, 5.66 KiB, 3.1x a larger one).
  ConfigError e = refusal(
      f, h100 + "collective_bw_by_size: {all_gather: [[65536, 1.0e8], [4194304, 2.0e11]]}\n");
  EXPECT_EQ(e.field(), "hardware.collective_bw_by_size.all_gather");
  for (const char* w :
       {kBytesRule, "all-gather is priced at", "fix: a rate may grow with the size"})
    EXPECT_TRUE(mentions(e.what(), w)) << w << " in: " << e.what();
  // Between two points too: the two ends within 1.5x (an all-reduce of 64 KiB 211 us, of
  // 256 KiB 143 us), the rate 6x at 4x the bytes, interpolated in log(bytes): a 128 KiB call
  // is priced at 125 us, 1.69x less than the 64 KiB one. (The three kinds alike, so that the
  // all-reduce stays below its reduce-scatter + all-gather.)
  const std::string steep = "[[65536, 3.3e8], [262144, 2.0e9]]";
  e = refusal(f, h100 + "collective_bw_by_size: {all_reduce: " + steep + ", all_gather: " + steep +
                     ", reduce_scatter: " + steep + "}\n");
  EXPECT_EQ(e.field(), "hardware.collective_bw_by_size.all_reduce") << e.what();
  for (const char* w :
       {kBytesRule, "the 64KiB all-reduce is priced at 211 us", "the 128KiB one 125 us", "1.69x"})
    EXPECT_TRUE(mentions(e.what(), w)) << w << " in: " << e.what();
  // Ops: a FLOP rate 1e4x over 1e3x the FLOPs, in flops_by_size and in a rated op's curve.
  e = refusal(f, h100 + "flops_by_size: [[1.0e6, 1.0e9], [1.0e9, 1.0e13]]\n");
  EXPECT_EQ(e.field(), "hardware.flops_by_size");
  EXPECT_TRUE(mentions(e.what(), "an op of 1e+06 FLOPs is priced at 1e+03 us")) << e.what();
  e = refusal(f, h100 + "op_rates_by_size: {gelu: [[1.0e6, 1.0e9], [1.0e9, 1.0e13]]}\n");
  EXPECT_EQ(e.field(), "hardware.op_rates_by_size.gelu");
}

TEST(DescriptionCheck, APriceThatIsNotAFiniteNumberIsRefused) {
  const Folder f;
  const std::string h100 = hardware_to_yaml(load_hardware("h100"));
  // Each number > 0, the product 0: no rate.
  Hardware tiny = load_hardware("h100");
  tiny.flops_f32 = tiny.flops_efficiency = 1e-200;
  ConfigError e = refusal(f, hardware_to_yaml(tiny));
  EXPECT_EQ(e.field(), "hardware.flops.f32") << e.what();
  EXPECT_TRUE(mentions(e.what(), kPriceRule)) << e.what();
  // A rate so small that a call's price is infinite.
  e = refusal(f, h100 + "collective_bw_by_size: {all_to_all: [[65536, 1.0e-305]]}\n");
  EXPECT_EQ(e.field(), "hardware.collective_bw_by_size.all_to_all") << e.what();
  EXPECT_TRUE(mentions(e.what(), "is inf s")) << e.what();
  // The parser refuses a point that is not finite, as it does a latency.
  e = config_error([&] {
    hardware_from_yaml(h100 + "collective_bw_by_size: {all_reduce: [[65536, .inf]]}\n", "t.yaml");
  });
  EXPECT_EQ(e.field(), "hardware.collective_bw_by_size.all_reduce[0]");
  std::string inf_latency = kCpuHost;
  inf_latency.replace(inf_latency.find("latency: 4.4e-5"), 15, "latency: .inf");
  EXPECT_EQ(config_error([&] { hardware_from_yaml(inf_latency, "t.yaml"); }).field(),
            "hardware.intra_node.latency");
}

// The test suite's old calibration curve (tests/support/test_calibration.h before this
// check): a 64 KiB all-reduce 7.1x its reduce-scatter + all-gather. As this machine's cache it
// is not used, and the plan says why; as a file named by --hardware, weft plan exits 2.
TEST(DescriptionCheck, ACacheWhoseModelContradictsItselfIsNotUsed) {
  const Folder f;
  Hardware hw = hardware_from_yaml(kCpuHost, "cpu");
  hw.coll_bw_by_size[0] = {{65536, 1.7e7}, {262144, 6.6e7}, {1048576, 2.4e8}, {4194304, 9.6e8}};
  hw.coll_bw_by_size[1] = {{65536, 4.6e8}, {262144, 6.4e8}, {1048576, 8.4e8}, {4194304, 8.3e8}};
  hw.coll_bw_by_size[2] = {{65536, 1.1e8}, {262144, 2.4e8}, {1048576, 1.1e8}, {4194304, 4.2e8}};
  hw.machine = this_machine();
  hw.calibrated_at = "2026-12-06T00:00:00Z";
  const std::string path = (f.dir / "cache.yaml").string();
  write_machine_cache(hw, path);
  std::string why;
  EXPECT_FALSE(read_machine_cache(path, this_machine(), &why).has_value());
  for (const std::string w :
       {std::string("warning: ") + path + " is not used",
        std::string("hardware.collective_bw_by_size.all_reduce"), std::string(kDecompositionRule),
        std::string("64KiB"), std::string("run `weft calibrate` again")})
    EXPECT_TRUE(mentions(why, w)) << w << " in: " << why;
  test::CommandResult r = test::run_weft("plan --config " + std::string(WEFT_SOURCE_DIR) +
                                         "/configs/gpt-layout.yaml --world 2 --hardware " + path);
  EXPECT_EQ(r.code, 2) << r.out;
  for (const std::string w : {std::string("hardware.collective_bw_by_size.all_reduce"), path})
    EXPECT_TRUE(mentions(r.out, w)) << w << " in: " << r.out;
  // Within the rule (all-reduce at the rates the suite's calibration now has) it is used.
  hw.coll_bw_by_size[0] = {{65536, 1.1e8}, {262144, 2.3e8}, {1048576, 2.4e8}, {4194304, 9.6e8}};
  write_machine_cache(hw, path);
  EXPECT_TRUE(read_machine_cache(path, this_machine(), &why).has_value()) << why;
}

}  // namespace
}  // namespace weft::planner
