// Parser and queries for dimension annotations.
#include "core/graph/dim_annotation.h"

#include <algorithm>
#include <sstream>

#include "base/check.h"

namespace weft::core {
namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(trim(cur));
  return parts;
}

DimSymbol parse_symbol(std::string tok, const std::string& text) {
  DimSymbol s;
  if (!tok.empty() && tok.back() == '^') {
    s.frozen = true;
    tok.pop_back();
  }
  WEFT_CHECK(!tok.empty(), "empty dim symbol in annotation '", text, "'");
  s.name = tok;
  return s;
}

AnnotatedTensor parse_tensor(const std::string& t, const std::string& text) {
  AnnotatedTensor out;
  std::istringstream is(t);
  std::string tok;
  AnnotatedDim group;
  bool in_group = false;
  while (is >> tok) {
    while (!tok.empty()) {
      if (tok[0] == '(') {
        WEFT_CHECK(!in_group, "nested group in annotation '", text, "'");
        in_group = true;
        tok.erase(0, 1);
        continue;
      }
      size_t close = tok.find(')');
      std::string sym = close == std::string::npos ? tok : tok.substr(0, close);
      if (!sym.empty()) {
        if (in_group) group.push_back(parse_symbol(sym, text));
        else out.push_back({parse_symbol(sym, text)});
      }
      if (close == std::string::npos) break;
      WEFT_CHECK(in_group, "unbalanced ')' in annotation '", text, "'");
      out.push_back(group);
      group.clear();
      in_group = false;
      tok.erase(0, close + 1);
    }
  }
  WEFT_CHECK(!in_group, "unclosed '(' in annotation '", text, "'");
  return out;
}

std::vector<AnnotatedTensor> parse_side(const std::string& side, const std::string& text) {
  std::vector<AnnotatedTensor> tensors;
  if (trim(side).empty()) return tensors;
  for (const std::string& t : split_on(side, ',')) tensors.push_back(parse_tensor(t, text));
  return tensors;
}

int find_dim(const AnnotatedTensor& t, const std::string& symbol) {
  for (size_t d = 0; d < t.size(); ++d)
    for (const DimSymbol& s : t[d])
      if (s.name == symbol) return int(d);
  return -1;
}

}  // namespace

DimAnnotation DimAnnotation::parse(const std::string& text) {
  size_t arrow = text.find("->");
  WEFT_CHECK(arrow != std::string::npos, "annotation '", text, "' has no '->'");
  DimAnnotation a;
  a.text_ = text;
  a.inputs_ = parse_side(text.substr(0, arrow), text);
  a.outputs_ = parse_side(text.substr(arrow + 2), text);
  return a;
}

std::vector<std::string> DimAnnotation::symbols() const {
  std::vector<std::string> names;
  auto visit = [&](const std::vector<AnnotatedTensor>& side) {
    for (const auto& t : side)
      for (const auto& d : t)
        for (const auto& s : d)
          if (s.name != "1" && std::find(names.begin(), names.end(), s.name) == names.end())
            names.push_back(s.name);
  };
  visit(inputs_);
  visit(outputs_);
  return names;
}

SplitKind DimAnnotation::split_kind(const std::string& symbol) const {
  bool in_input = false, in_output = false, frozen = false;
  auto visit = [&](const std::vector<AnnotatedTensor>& side, bool& seen) {
    for (const auto& t : side)
      for (const auto& d : t)
        for (const auto& s : d)
          if (s.name == symbol) {
            seen = true;
            frozen = frozen || s.frozen;
          }
  };
  visit(inputs_, in_input);
  visit(outputs_, in_output);
  if (!in_input && !in_output) return SplitKind::kAbsent;
  if (frozen) return SplitKind::kFrozen;
  return in_output ? SplitKind::kSpatial : SplitKind::kReduction;
}

int DimAnnotation::input_dim(int index, const std::string& symbol) const {
  return find_dim(inputs_.at(index), symbol);
}
int DimAnnotation::output_dim(int index, const std::string& symbol) const {
  return find_dim(outputs_.at(index), symbol);
}

}  // namespace weft::core
