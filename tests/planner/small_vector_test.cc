// SmallVector (planner/small_vector.h): the inline lists that hold an instruction's operands
// and lowering's per-slot tensors must behave as the std::vector they replaced, on both
// sides of the inline capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "planner/operands.h"
#include "planner/small_vector.h"

namespace weft::planner {
namespace {

using Ints = SmallVector<int, 2>;

std::vector<int> items(const Ints& v) { return std::vector<int>(v.begin(), v.end()); }

TEST(SmallVector, GrowsPastItsInlineCapacityKeepingEveryElement) {
  Ints v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.capacity(), 2u);
  std::vector<int> want;
  for (int i = 0; i < 37; ++i) {
    v.push_back(i * 3);
    want.push_back(i * 3);
    ASSERT_EQ(items(v), want) << "after " << i + 1 << " elements";
  }
  EXPECT_GE(v.capacity(), 37u);
  EXPECT_EQ(v.front(), 0);
  EXPECT_EQ(v.back(), 108);
  EXPECT_EQ(v.at(36), 108);
  EXPECT_THROW(v.at(37), std::out_of_range);
}

TEST(SmallVector, PushingAnElementOfItselfAcrossAGrowthCopiesTheValue) {
  Ints v = {5, 6};  // full inline: the next push moves the storage to the heap
  v.push_back(v[0]);
  EXPECT_EQ(items(v), (std::vector<int>{5, 6, 5}));
  v.push_back(v.back());  // 3 of 4: no growth
  v.push_back(v[1]);      // growth again
  EXPECT_EQ(items(v), (std::vector<int>{5, 6, 5, 5, 6}));
}

TEST(SmallVector, CopiesAndMovesAreIndependentOnBothSidesOfTheCapacity) {
  for (int n : {0, 1, 2, 3, 9}) {
    Ints a;
    for (int i = 0; i < n; ++i) a.push_back(i + 1);
    Ints b = a;  // copy
    EXPECT_EQ(b, a);
    if (n > 0) {
      b[0] = 100;
      EXPECT_EQ(a[0], 1) << n;  // no shared storage
    }
    Ints c = std::move(b);
    EXPECT_EQ(c.size(), size_t(n));
    EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): a moved-from list is empty
    Ints d = {7};
    d = c;  // copy-assign over an inline list
    EXPECT_EQ(d, c);
    Ints e;
    for (int i = 0; i < 5; ++i) e.push_back(-i);
    e = std::move(d);  // move-assign over a heap list
    EXPECT_EQ(e, c);
    e = {4, 5, 6};
    EXPECT_EQ(items(e), (std::vector<int>{4, 5, 6}));
  }
}

TEST(SmallVector, EraseAndClearAsStdVector) {
  Ints v = {1, 2, 3, 4, 5, 6};
  v.erase(std::remove_if(v.begin() + 1, v.end(), [](int x) { return x % 2 == 0; }), v.end());
  EXPECT_EQ(items(v), (std::vector<int>{1, 3, 5}));
  v.erase(v.begin(), v.begin() + 1);
  EXPECT_EQ(items(v), (std::vector<int>{3, 5}));
  v.clear();
  EXPECT_TRUE(v.empty());
  v.push_back(9);
  EXPECT_EQ(items(v), (std::vector<int>{9}));
}

TEST(SmallVector, EqualityComparesElementsNotCapacity) {
  Ints inline_list = {1, 2};
  Ints heap_list;
  heap_list.reserve(16);
  heap_list.push_back(1);
  heap_list.push_back(2);
  EXPECT_EQ(inline_list, heap_list);
  heap_list.push_back(3);
  EXPECT_FALSE(inline_list == heap_list);
}

TEST(OperandList, KeepsSlotTensorAndAccumulate) {
  // Operand packs the slot in 16 bits next to the tensor id: the fields read back as written.
  OperandList ops = {{-1, 7}, {2, 123456, true}, {32767, 0}};
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].slot, -1);
  EXPECT_EQ(ops[0].tensor, 7);
  EXPECT_FALSE(ops[0].accumulate);
  EXPECT_EQ(ops[1].slot, 2);
  EXPECT_EQ(ops[1].tensor, 123456);
  EXPECT_TRUE(ops[1].accumulate);
  EXPECT_EQ(ops[2].slot, 32767);
  std::vector<Operand> many;
  for (int i = 0; i < 40; ++i) many.push_back({i, 1000 + i, i % 3 == 0});
  OperandList bucket = many;  // a gradient bucket's list: on the heap
  EXPECT_EQ(bucket.to_vector(), many);
}

}  // namespace
}  // namespace weft::planner
