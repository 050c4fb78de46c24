// The rules a calibration's measured collectives obey on any real machine, checked before a
// calibration prices a plan: where a measured time breaks one, the machine was disturbed
// while it was measured, and the curves fitted from it mislead the planner (a cache whose
// 64 KiB all-reduce took 4 ms, 7x its reduce-scatter and all-gather together, made the
// lowering split every all-reduce in two: programs 1.6-2.5x slower than the defaults').
// `weft calibrate` re-measures a world that breaks a rule and refuses to write a calibration
// that still does (launch/calibration_recheck.h); read_machine_cache does not use a cache
// that breaks one (planner/hardware.h).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace weft::planner {

struct Hardware;

// Measured collective calls: world -> the probe's name for a call ("ar_world_64KiB",
// "ag_world_1MiB", "rs_world_4MiB", "p2p_4B": launch/calibration.cc) -> seconds, each the
// least of its probes. Other names are ignored.
using CollectiveTimes = std::map<int, std::map<std::string, double>>;

// How much more than another a least-of-probes time may take before the two contradict
// each other: 1.5x. From the repeat spread on this project's 2-core VM (docs/planner.md,
// "A calibration checks its collectives"): twelve probes of one call clustered within
// 1.1-1.3x of their least, the rest a scheduler tick (4 ms) later, 1.6-48x; the calibration
// that misled the planner broke a rule by 6.9x.
constexpr double kCollectiveSpread = 1.5;

struct CollectiveContradiction {
  std::string rule;  // kDecompositionRule or kBytesRule
  int world = 0;
  std::string call;  // the probe name of the point that breaks it
  std::string text;  // one line: the rule, the world, the sizes and the numbers
};

// One world's calls by kind and size, what the two rules judge: the probe's kind prefix
// ("ar_world", "ag_world", "rs_world", "p2p"; "a2a", "a2av" for a model's all-to-alls) ->
// bytes of the call -> seconds. A time that is not a number > 0 is not judged.
using SizedCalls = std::map<std::string, std::map<double, double>>;

// The two rules on one world's calls, each beyond `spread`. `verb` says what the times are
// in the texts: "took" (measured) or "is priced at" (a description's model,
// description_check.h). Each contradiction's `call` is the kind's prefix and the size
// ("ar_world_64KiB"), the size as size_text gives it.
std::vector<CollectiveContradiction> judge_calls(int world, const SizedCalls& calls, double spread,
                                                 const std::string& verb);

// The sizes of the probe's calls in bytes, ascending: 4 B, 64 KiB, 256 KiB, 1 MiB, 4 MiB.
std::vector<double> probe_sizes();

// Bytes as the probe names them: "4B", "64KiB", "1MiB"; a size between those with up to 3
// significant digits ("90.5KiB").
std::string size_text(double bytes);

// An all-reduce of B bytes can always run as the reduce-scatter of B then the all-gather of
// B (Gloo's reduce-scatter even is an all-reduce and a slice), so it never takes longer
// than the two together.
inline constexpr const char* kDecompositionRule = "all-reduce <= reduce-scatter + all-gather";
// A call of one kind on more bytes moves more: it never takes less time than a smaller one.
inline constexpr const char* kBytesRule = "a larger call takes no less time";

// Whether the calls at `world` processes are judged: those the cores run without
// oversubscription (world <= max(2, cores)), which the link fit and the collective curves
// are fitted from. Over the cores a call's time is whichever process held a core, not the
// collective; the model reads only the step-like loops there.
bool judged_world(int world, int cores);

// kCollectiveSpread, or (tests only) WEFT_TEST_COLLECTIVE_SPREAD when set to a number >= 1:
// the end-to-end test of `weft calibrate`'s file checks the writing path on a machine the
// suite keeps busy, where a real probe may contradict itself through every re-measure; the
// rules and the refusal are tested on made-up curves and injected probes.
double collective_spread();

// Every contradiction of the two rules, beyond collective_spread(), at the judged worlds of
// `t`. Empty: the measurements are consistent.
std::vector<CollectiveContradiction> check_collectives(const CollectiveTimes& t, int cores);

// The collective times a calibration recorded under `measurements:` (gloo_n<N>_<name>_s, as
// `weft calibrate` writes them); empty for a description without them (a preset, a file
// written by hand), which has nothing to check.
CollectiveTimes recorded_collective_times(const Hardware& hw);

// The contradictions as lines, one per contradiction ("" when none).
std::string describe(const std::vector<CollectiveContradiction>& found);

}  // namespace weft::planner
