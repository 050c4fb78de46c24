// An instruction's operands, stored in the instruction. A plan holds about a million
// instructions at 512 ranks, nearly all with at most three inputs and three outputs; a heap
// vector per operand list cost two allocations per instruction and, for every reader that
// walks the programs (the engine, plan_work), a cache miss per list. OperandList keeps up to
// three operands inside the instruction and moves to the heap beyond that (gradient
// buckets, frees of many tensors).
#pragma once

#include <cstdint>

#include "planner/small_vector.h"

namespace weft::planner {

// 8 bytes: the tensor id, the graph op's slot (an op has far fewer than 2^15 operands) and
// the accumulate flag.
struct Operand {
  int tensor = -1;      // local tensor id
  int16_t slot = -1;    // index into the graph op's inputs/outputs; -1: a scratch tensor
  bool accumulate = false;  // outputs: add into the existing tensor
  constexpr Operand() = default;
  constexpr Operand(int slot_, int tensor_, bool accumulate_ = false)
      : tensor(tensor_), slot(int16_t(slot_)), accumulate(accumulate_) {}
  bool operator==(const Operand& o) const = default;
};
static_assert(sizeof(Operand) == 8);

using OperandList = SmallVector<Operand, 3>;
static_assert(sizeof(OperandList) == 32);

}  // namespace weft::planner
