// CRC-32C: the known answers of RFC 3720 / iSCSI, and extension over split buffers at
// every alignment (the hardware path works 8 bytes at a time, the tail byte by byte).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/crc32c.h"

namespace weft::checkpoint {
namespace {

TEST(Crc32c, KnownAnswers) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32);
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = uint8_t(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
}

TEST(Crc32c, ExtendsOverAnySplit) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(char(i * 131 + 7));
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut = 0; cut <= 40; ++cut) EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), whole);
  s[500] ^= 1;
  EXPECT_NE(crc32c(s.data(), s.size()), whole);
}

}  // namespace
}  // namespace weft::checkpoint
