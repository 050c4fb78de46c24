// "Did you mean ...?" for mistyped names (YAML keys, command-line flags): one rule, so every
// error suggests the same way.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

// Levenshtein distance.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` when it is near enough to be a typo (at most a third of
// the word's length in edits, and at least 2 allowed); nullopt otherwise. The first of
// equally close candidates wins.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

}  // namespace weft
