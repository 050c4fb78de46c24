// The rules a hardware description's model obeys, checked where a description is loaded
// (load_hardware: `weft plan --hardware`, `weft bench scaling --compare`; read_machine_cache:
// the machine's calibration, $WEFT_COST_CACHE) and before `weft calibrate` writes one. The
// calibration check (calibration_check.h) judges the calls a calibration measured; this one
// judges what the model prices, through the CostModel functions the planner calls, so that a
// preset or a file written by hand is judged too: an all-reduce priced above its
// reduce-scatter + all-gather makes the lowering split every all-reduce in two, a rate curve
// that makes a larger call cheaper than a smaller one makes a plan that merges calls look
// free, and a price that is not a finite number of seconds >= 0 makes every plan compare
// equal or NaN.
#pragma once

#include <string>
#include <vector>

#include "planner/calibration_check.h"

namespace weft::planner {

struct Hardware;

// A price of the model is a finite number of seconds >= 0, and every rate it reads is a
// finite number > 0 (the parser checks each number; a rate's product with its efficiency, or
// a curve's interpolation, can still leave that range).
inline constexpr const char* kPriceRule = "a price is a finite number of seconds >= 0";

struct DescriptionContradiction {
  std::string rule;   // kDecompositionRule, kBytesRule or kPriceRule
  std::string field;  // the key to change: "hardware.collective_bw_by_size.all_reduce"
  std::string text;   // one line: the rule, where, the sizes, the numbers and the fix
};

// The contradictions of the description `hw` in either dtype's model (Hardware::cost_model),
// beyond collective_spread() for the two collective rules. Judged:
// - the collectives (all-reduce, all-gather, reduce-scatter, the all-to-alls, one-way
//   messages) inside a node at 2 ranks (where `weft calibrate` measures its curves) and at
//   ranks_per_node, at the probe's sizes (4 B to 4 MiB), at every point of the
//   collective_bw_by_size curves and at three sizes between each two of those (the model
//   interpolates between them): kDecompositionRule and kBytesRule, as a calibration's calls;
// - ops (hardware.flops_by_size, each op_rates_by_size curve) at their points and between:
//   a larger op costs no less time (kBytesRule's reason: it does more);
// - kPriceRule on every price above, across nodes too, and on the scalar rates.
// One contradiction per rule and key, the first found; empty: the description is consistent.
// A description without curves (the presets) prices every call linearly in its bytes, which
// obeys every rule.
std::vector<DescriptionContradiction> check_description(const Hardware& hw);

// The first contradiction's text and field, how many more, and the fix, as one line.
std::string describe(const std::vector<DescriptionContradiction>& found);

}  // namespace weft::planner
