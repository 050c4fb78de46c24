// The plan as a JSON file. Layout:
//   {"format": "weft-plan/1",
//    "hash": {"model": "<hex>", "shapes": "<hex>"},   refused when the job differs
//    "decisions": {mesh, parallel config, per-op splits, group families and groups,
//                  roles: {stage, lane, tensors, program}},
//    "costs": {cost model, predicted step time, bubble, per-rank time/memory/volume}}
// Decisions and cost annotations are kept apart: reading a plan back gives the same
// decisions whatever the costs say, and re-simulating replaces only "costs".
#pragma once

#include <string>

#include "planner/plan.h"

namespace weft::planner {

std::string plan_to_json(const Plan& plan);
// Throws IoError for text that is not a plan of this format.
Plan plan_from_json(const std::string& text);

void write_plan_file(const Plan& plan, const std::string& path);
Plan read_plan_file(const std::string& path);

}  // namespace weft::planner
