// stream_copy: the same bytes as memcpy for every size class and misalignment of either end,
// and nothing written outside the destination.
#include "base/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace weft {
namespace {

TEST(StreamCopy, CopiesExactlyTheBytesAtEveryAlignmentAndSize) {
  std::mt19937 rng(7);
  // Below the small-copy cut (16 KiB), around it, whole lines, and several MiB with tails.
  const std::vector<size_t> sizes = {0,         1,         63,        64,        65,
                                     16383,     16384,     16385,     100000,    (1u << 20) + 17,
                                     3u << 20};
  const size_t guard = 128;
  for (size_t n : sizes)
    for (size_t src_off : {0, 1, 8, 33})
      for (size_t dst_off : {0, 3, 16, 61}) {
        std::vector<uint8_t> src(n + src_off), dst(n + dst_off + 2 * guard, 0xA5);
        for (uint8_t& b : src) b = uint8_t(rng());
        stream_copy(dst.data() + guard + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < guard + dst_off; ++i)
          ASSERT_EQ(dst[i], 0xA5) << "wrote before the destination: n " << n << ", at " << i;
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(dst[guard + dst_off + i], src[src_off + i])
              << "n " << n << ", src +" << src_off << ", dst +" << dst_off << ", byte " << i;
        for (size_t i = guard + dst_off + n; i < dst.size(); ++i)
          ASSERT_EQ(dst[i], 0xA5) << "wrote past the destination: n " << n << ", at " << i;
      }
}

}  // namespace
}  // namespace weft
