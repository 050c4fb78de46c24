// Dimension annotations (nnScaler/einops style) that tell the planner how an op may be
// partitioned: "b t k, n k, n -> b t n" names every dim of every input and output.
//   - a symbol that appears in an output may be split: each part of the op computes the
//     matching part of that output (spatial split);
//   - a symbol that appears only in inputs is a reduction: splitting it leaves partial
//     sums in the outputs (value split V in the RVD layout);
//   - a symbol marked `^` anywhere must stay whole (e.g. the channel dim of LayerNorm);
//   - a group "(3 h d)" is one tensor dim made of several symbols: splitting h splits the
//     dim in 3 strided chunks (custom rule: attention by heads);
//   - "1" is a size-1 (scalar) dim; an empty side "->" is a scalar output.
#pragma once

#include <string>
#include <vector>

namespace weft::core {

struct DimSymbol {
  std::string name;
  bool frozen = false;
};
// One tensor dim: usually one symbol, several when grouped.
using AnnotatedDim = std::vector<DimSymbol>;
using AnnotatedTensor = std::vector<AnnotatedDim>;

enum class SplitKind { kSpatial, kReduction, kFrozen, kAbsent };

class DimAnnotation {
 public:
  DimAnnotation() = default;
  // Parses the annotation; throws InternalError on a malformed string.
  static DimAnnotation parse(const std::string& text);

  const std::string& text() const { return text_; }
  const std::vector<AnnotatedTensor>& inputs() const { return inputs_; }
  const std::vector<AnnotatedTensor>& outputs() const { return outputs_; }
  // Every distinct symbol, in order of first appearance.
  std::vector<std::string> symbols() const;
  // How splitting `symbol` partitions the op.
  SplitKind split_kind(const std::string& symbol) const;
  // The tensor dim that holds `symbol` in input/output `index`, or -1.
  int input_dim(int index, const std::string& symbol) const;
  int output_dim(int index, const std::string& symbol) const;

 private:
  std::string text_;
  std::vector<AnnotatedTensor> inputs_, outputs_;
};

}  // namespace weft::core
