// `weft bench search`: the plan search's top candidates for a small GPT, each trained on real
// local ranks, predicted and measured step times side by side, and how the searched plan
// (the top predicted) does against the best measured one.
#pragma once

#include <string>
#include <vector>

namespace weft::launch {

// argv[0] is "search". Options: --quick, --steps N, --config FILE, --world N, --top K,
// --set K=V (repeatable), --all-variants, --help. Returns 0 when every candidate ran, 1 when
// one failed (its row says why), 2 on bad input (ConfigError).
int run_search_bench(const std::vector<std::string>& argv);

}  // namespace weft::launch
