// Annotation-driven op partitioning and the custom rules for fused ops.
#include "planner/partition.h"

#include <cctype>
#include <map>
#include <mutex>

#include "base/check.h"
#include "core/graph/dim_annotation.h"
#include "core/graph/op_table.h"

namespace weft::planner {
namespace {

using core::AnnotatedTensor;
using core::DimAnnotation;
using core::Graph;
using core::Op;

const DimAnnotation& annotation(const std::string& type) {
  static std::mutex mu;
  static std::map<std::string, DimAnnotation> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(type);
  if (it == cache.end())
    it = cache.emplace(type, DimAnnotation::parse(core::op_def(type).annotation)).first;
  return it->second;
}

bool is_number(const std::string& s) {
  return !s.empty() && std::isdigit(static_cast<unsigned char>(s[0]));
}

// MoE tensors index tokens as n = (b t) and assignments as a = (b t k): a batch split
// cuts those dims too, proportionally.
std::vector<std::string> split_symbols(const std::string& type, const std::string& symbol) {
  if (symbol == "b" && (type == "moe" || type == "moe.bwd")) return {"b", "n", "a"};
  return {symbol};
}

// The vocabulary dims: the embedding's v and the tied LM head's n (matmul is only the head,
// core/graph/op_table.cc). tp need not divide the vocabulary, so these split into balanced
// parts (256 over 3 = 86, 85, 85); every op cuts the same rows, so the embedding, the head
// and the cross-entropy of one lane agree and no layout conversion is needed between them.
bool vocab_symbol(const std::string& type, const std::string& symbol) {
  return ((type == "embedding" || type == "embedding.bwd") && symbol == "v") ||
         ((type == "matmul" || type == "matmul.bwd") && symbol == "n");
}

// Head symbols that never stand alone in an annotation are sized from the op's attributes:
// h (heads), g (KV heads), r (query heads per KV head), d (head size). -1 when unknown.
int64_t head_symbol_size(const Op& op, const std::string& symbol) {
  const int64_t H = op.attrs.i_or("heads", -1), KV = op.attrs.i_or("kv_heads", -1);
  if (symbol == "h") return H;
  if (symbol == "g") return KV;
  if (symbol == "r") return H > 0 && KV > 0 && H % KV == 0 ? H / KV : -1;
  if (symbol == "d") return op.attrs.i_or("head_dim", -1);
  return -1;
}

int find_dim(const AnnotatedTensor& t, const std::vector<std::string>& syms, int* pos) {
  for (size_t d = 0; d < t.size(); ++d)
    for (size_t p = 0; p < t[d].size(); ++p)
      for (const std::string& s : syms)
        if (t[d][p].name == s) {
          *pos = int(p);
          return int(d);
        }
  return -1;
}

// Splits one operand along the annotated dim holding one of `syms`; returns false when
// the operand has no such dim (the caller then replicates or marks a partial sum).
bool split_operand(const Graph& g, const Op& op, const AnnotatedTensor& at,
                   const std::vector<std::string>& syms, int64_t n, int64_t k, int64_t groups,
                   SubTensor& st) {
  int pos = 0;
  int d = find_dim(at, syms, &pos);
  if (d < 0 || d >= int(st.piece.box.size())) return false;
  DimSlice& slice = st.piece.box[d];
  std::optional<DimSlice> cut;
  if (at[d].size() == 1 && groups == 1 && vocab_symbol(op.type, syms[0])) {
    cut = slice.balanced_part(k, n);
  } else if (at[d].size() == 1) {
    cut = slice.part(k, n, groups);
  } else {
    // A grouped dim (3 h d): chunks of the split symbol inside every outer group.
    int64_t outer = 1, inner = 1;
    for (int p = 0; p < pos; ++p) outer *= symbol_size(g, op.id, at[d][p].name);
    for (size_t p = pos + 1; p < at[d].size(); ++p) inner *= symbol_size(g, op.id, at[d][p].name);
    int64_t sp = symbol_size(g, op.id, at[d][pos].name);
    int64_t full = g.value(st.value).shape.at(d);
    WEFT_CHECK(slice.start == 0 && slice.count == 1 && slice.size == full,
               "op ", op.type, ": grouped dim ", d, " was already split");
    if (sp % n == 0)
      cut = DimSlice{k * (sp / n) * inner, (sp / n) * inner, outer, sp * inner}.normalised();
  }
  WEFT_CHECK(cut.has_value(), "op %", op.id, " ", op.type, ": dim ", d, " (", box_str(st.piece.box),
             ") does not split into ", n, " along ", syms[0]);
  slice = *cut;
  if (syms[0] == "b") st.batch_dim = d;
  return true;
}

void make_partial(SubTensor& st, int64_t n, int64_t k) {
  st.piece.part = int32_t(st.piece.part * n + k);
  st.piece.parts = int32_t(st.piece.parts * n);
}

// The generic rule: split every operand that carries the symbol; outputs without it
// become partial sums; inputs without it are read whole (replicated).
void generic_split(const Graph& g, const Op& op, const DimAnnotation& a, const std::string& symbol,
                   int64_t n, int64_t k, int64_t groups, SubOp& s) {
  std::vector<std::string> syms = split_symbols(op.type, symbol);
  for (size_t i = 0; i < s.ins.size() && i < a.inputs().size(); ++i)
    split_operand(g, op, a.inputs()[i], syms, n, k, groups, s.ins[i]);
  for (size_t j = 0; j < s.outs.size(); ++j) {
    int ai = annotation_output(op, int(j));
    if (ai >= int(a.outputs().size()) ||
        !split_operand(g, op, a.outputs()[ai], syms, n, k, groups, s.outs[j])) {
      make_partial(s.outs[j], n, k);
      if (symbol == "b") s.outs[j].batch_partial = true;
    }
  }
}

// Outputs (by annotation index) that a custom rule knows to be whole on every part.
void keep_whole(const Op& op, const SubOp& base, SubOp& s, std::initializer_list<int> ann_outs) {
  for (size_t j = 0; j < s.outs.size(); ++j)
    for (int ai : ann_outs)
      if (annotation_output(op, int(j)) == ai) s.outs[j].piece = base.outs[j].piece;
}

// `balanced`: the vocabulary, which may split unevenly (see vocab_symbol).
void split_dim(SubTensor& st, int d, int64_t n, int64_t k, bool balanced = false) {
  const DimSlice& whole = st.piece.box.at(d);
  auto cut = balanced ? whole.balanced_part(k, n) : whole.part(k, n, 1);
  WEFT_CHECK(cut.has_value(), "dim ", d, " of ", box_str(st.piece.box), " does not split into ", n);
  st.piece.box[d] = *cut;
}

}  // namespace

int annotation_output(const Op& op, int k) {
  int seen = -1;
  for (int ai = 0;; ++ai) {
    if (op.attrs.ints.count("skip_out" + std::to_string(ai))) continue;
    if (++seen == k) return ai;
  }
}

int64_t symbol_size(const Graph& g, int op_id, const std::string& symbol) {
  if (is_number(symbol)) return std::stoll(symbol);
  const Op& op = g.op(op_id);
  const DimAnnotation& a = annotation(op.type);
  auto scan = [&](const AnnotatedTensor& at, int value, int64_t* out) {
    const core::Shape& shape = g.value(value).shape;
    for (size_t d = 0; d < at.size() && d < shape.size(); ++d) {
      int64_t known = 1;
      int unknown = -1, hits = 0;
      for (size_t p = 0; p < at[d].size(); ++p) {
        const std::string& name = at[d][p].name;
        if (name == symbol) unknown = int(p), ++hits;
        else if (is_number(name)) known *= std::stoll(name);
        else if (at[d].size() > 1) {
          // Another symbol of the group: resolvable when it stands alone elsewhere.
          int64_t other = -1;
          for (size_t i = 0; i < a.inputs().size() && i < op.inputs.size() && other < 0; ++i)
            for (size_t e = 0; e < a.inputs()[i].size(); ++e)
              if (a.inputs()[i][e].size() == 1 && a.inputs()[i][e][0].name == name)
                other = g.value(op.inputs[i]).shape.at(e);
          for (size_t j = 0; j < op.outputs.size() && other < 0; ++j) {
            int ai = annotation_output(op, int(j));
            if (ai >= int(a.outputs().size())) continue;
            const AnnotatedTensor& ot = a.outputs()[ai];
            const core::Shape& os = g.value(op.outputs[j]).shape;
            for (size_t e = 0; e < ot.size() && e < os.size(); ++e)
              if (ot[e].size() == 1 && ot[e][0].name == name) other = os[e];
          }
          if (other < 0) other = head_symbol_size(op, name);
          if (other < 0) hits = -100;  // two unknowns in this group
          else known *= other;
        }
      }
      if (hits == 1 && unknown >= 0) {
        *out = shape[d] / known;
        return true;
      }
    }
    return false;
  };
  int64_t size = -1;
  for (size_t i = 0; i < a.inputs().size() && i < op.inputs.size(); ++i)
    if (scan(a.inputs()[i], op.inputs[i], &size)) return size;
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    int ai = annotation_output(op, int(j));
    if (ai < int(a.outputs().size()) && scan(a.outputs()[ai], op.outputs[j], &size)) return size;
  }
  if (int64_t n = head_symbol_size(op, symbol); n > 0) return n;
  throw InternalError("op %" + std::to_string(op_id) + " " + op.type + ": cannot size symbol '" +
                      symbol + "'");
}

SubOp whole_op(const Graph& g, int op_id) {
  const Op& op = g.op(op_id);
  SubOp s;
  s.op = op_id;
  for (int v : op.inputs) s.ins.push_back({v, Piece{full_box(g.value(v).shape)}});
  for (int v : op.outputs) s.outs.push_back({v, Piece{full_box(g.value(v).shape)}});
  return s;
}

SubOp partition_one(const Graph& g, const SubOp& base, const std::string& symbol, int64_t n,
                    int64_t k, int64_t groups) {
  const Op& op = g.op(base.op);
  const DimAnnotation& a = annotation(op.type);
  SubOp s = base;
  s.splits.push_back({symbol, n, k, groups});
  if (n == 1) return s;
  const std::string& t = op.type;

  if ((t == "cross_entropy" || t == "cross_entropy.bwd") && symbol == "v") {
    // Vocabulary-parallel: each part holds a slice of the logits (or probs); its row max
    // and sum of exponentials are addends (V-max, V-sum) that lowering joins through phase
    // 3, so the loss is whole.
    // Balanced slices, the same rows as the head's and the embedding's (vocab_symbol).
    split_dim(s.ins[0], 2, n, k, true);
    if (t == "cross_entropy") {
      for (size_t j = 0; j < s.outs.size(); ++j)
        if (annotation_output(op, int(j)) == 1) split_dim(s.outs[j], 2, n, k, true);
    } else {
      split_dim(s.outs.at(0), 2, n, k, true);
    }
    s.vocab_parallel = true;
    return s;
  }
  if ((t == "moe" || t == "moe.bwd") && symbol == "e") {
    // Expert-parallel: the experts' weights (and their gradients) split; tokens stay with
    // their slice and travel to the experts by all_to_all_v during lowering.
    int first_weight = t == "moe" ? 2 : 3;
    for (int i = first_weight; i < first_weight + 4; ++i) split_dim(s.ins.at(i), 0, n, k);
    if (t == "moe.bwd")
      for (size_t j = 0; j < s.outs.size(); ++j)
        if (annotation_output(op, int(j)) >= 2) split_dim(s.outs[j], 0, n, k);
    s.expert_parallel = true;
    s.expert_parts *= n;
    s.expert_index = s.expert_index * n + k;
    return s;
  }

  core::SplitKind kind = a.split_kind(symbol);
  if (kind == core::SplitKind::kAbsent)
    throw NotSupported("op " + t + " has no dim '" + symbol + "' to split");
  if (kind == core::SplitKind::kFrozen)
    throw NotSupported("op " + t + ": dim '" + symbol + "' is frozen (^) and cannot be split");
  generic_split(g, op, a, symbol, n, k, groups, s);

  if (t == "linear" && symbol == "k" && s.ins.size() > 2) {
    s.ins[2].dropped = k != 0;  // row-parallel: the bias joins the partial sums once
  } else if (t == "linear.bwd" && symbol == "k") {
    keep_whole(op, base, s, {2});  // every part computes the whole bias gradient
  } else if (t == "embedding" && symbol == "v") {
    if (s.ins.size() > 2) s.ins[2].dropped = k != 0;  // vocab-parallel: positions added by part 0 only
  } else if (t == "embedding.bwd" && symbol == "v") {
    keep_whole(op, base, s, {1});
  } else if (t == "moe" && symbol == "f") {
    // Expert hidden units split: the router state is the same on every part, the expert
    // outputs are partial sums, the output bias is added by part 0 only.
    keep_whole(op, base, s, {1, 2, 3, 4});
    s.ins[5].dropped = k != 0;
  } else if (t == "moe.bwd" && symbol == "f") {
    make_partial(s.ins[11], n, k);  // the saved expert outputs were partial sums
    keep_whole(op, base, s, {5});
  }
  return s;
}

std::vector<SubOp> partition(const Graph& g, const SubOp& base, const std::string& symbol,
                             int64_t n, int64_t groups) {
  std::vector<SubOp> parts;
  for (int64_t k = 0; k < n; ++k) parts.push_back(partition_one(g, base, symbol, n, k, groups));
  return parts;
}

std::vector<SubOp> replicate(const SubOp& base, int64_t n) {
  return std::vector<SubOp>(size_t(n), base);
}

}  // namespace weft::planner
