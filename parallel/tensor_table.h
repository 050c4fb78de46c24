// The local tensors of one rank's program: persistent ones (parameters, gradient
// accumulators, optimizer state) allocated once, transient ones allocated when first written
// and released by kFree, aliases as views of their root's storage.
#pragma once

#include <vector>

#include "core/graph/graph.h"
#include "core/tensor.h"
#include "memory/allocator.h"
#include "planner/plan.h"

namespace weft::parallel {

class TensorTable {
 public:
  // Allocates every persistent root tensor, except the state roots when `defer_state`:
  // those stay undefined until adopt() installs them. All are zeroed but the gradient
  // accumulators, whose contents are unspecified until zero_gradients() (the executor
  // calls it at the start of every step, before anything reads them). `state` serves the
  // persistent roots, `transient` the others; both default to the host allocator and must
  // outlive the table.
  TensorTable(const planner::RankProgram& prog, const core::Graph& g,
              memory::Allocator* transient = nullptr, memory::Allocator* state = nullptr,
              bool defer_state = false);

  // Serves transient tensors allocated from now on from `a` (a memory plan replacing the
  // step-0 tracer); blocks already handed out go back to their own allocator.
  void set_transient_allocator(memory::Allocator* a) { transient_ = a; }

  const planner::TensorDesc& desc(int id) const { return prog_.tensors.at(size_t(id)); }
  size_t size() const { return prog_.tensors.size(); }
  bool live(int id) const;
  // Where a tensor's elements live: `tensor` holds `box` of the global value and the
  // tensor's own box lies inside it. For most tensors that is the tensor itself (or a view of
  // its root); for an alias a strided view cannot express (1/n of each of the three qkv
  // chunks under tp x ZeRO) it is the root, and callers copy the region in and out.
  struct Located {
    core::Tensor* tensor;
    const planner::Box* box;
  };
  Located locate(int id, bool write, bool accumulate);
  // False for the aliases above: read()/write() refuse them, locate() serves them.
  bool viewable(int id) const;

  // A tensor that must hold data already (read before write: InternalError naming it).
  core::Tensor& read(int id);
  // A tensor about to be written: allocated when absent (zeroed when `accumulate`, since the
  // instruction then adds into it), an alias view of its root otherwise.
  core::Tensor& write(int id, bool accumulate);
  // Drops a transient tensor (persistent ones and kept results stay).
  void release(int id);
  // Whether `id` is a state root: a persistent, non-alias tensor of a parameter or an
  // optimizer state (moments, master weights), what layout_of() turns into LocalTensors.
  bool state_root(int id) const;
  // Installs `t` as state root `id` (InternalError for another kind of tensor or for a
  // shape, dtype or layout that is not the plan's: a dense host tensor of the piece's
  // shape). Views made of the old root are dropped (they are made again from `t` on their
  // next use); the old storage is released unless someone else holds it.
  void adopt(int id, core::Tensor t);
  // Zeroes the persistent gradient accumulators (start of a step).
  void zero_gradients();
  // Drops the kept results of the last step (losses: transient tensors the trainer reads
  // after the step, never freed within it), so that a step never sees the last one's: until
  // this step writes a piece, it is not live (start of a step, after the trainer read them).
  void release_kept();
  // Allocates a transient tensor of an explicit shape (data-dependent sizes).
  core::Tensor& emplace(int id, const core::Shape& shape);
  // A flat buffer of `n` elements (at least one) that a collective packs into or a receive
  // lands in, from the transient allocator: planned with the step's activations
  // (memory.allocator). From the host allocator a buffer above glibc's mmap threshold
  // (32 MiB at most) was mapped anew at every call and faulted in by its first write: a
  // ZeRO-3 step of dp2 faulted 30-110k pages.
  core::Tensor staging(int64_t n, core::DType dtype);
  core::Tensor staging(const core::Shape& shape, core::DType dtype);
  std::string name(int id) const;
  // The slot itself, possibly undefined: for outputs whose size only the kernel knows
  // (data-dependent MoE rows), which the kernel allocates.
  core::Tensor& slot(int id) { return t_.at(size_t(id)); }

  const core::Graph& graph() const { return g_; }

 private:
  core::Tensor allocate(int id, bool zero);
  // Undefines `id` and every view of it, whatever their flags.
  void drop_with_views(int id);

  const planner::RankProgram& prog_;
  const core::Graph& g_;
  memory::Allocator* transient_;
  memory::Allocator* state_;
  std::vector<core::Tensor> t_;
  std::vector<std::vector<int>> aliases_;  // root -> tensors that view it
  std::vector<char> viewable_;
};

}  // namespace weft::parallel
