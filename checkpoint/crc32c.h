// CRC-32C (Castagnoli), the checksum of checkpoint shards: the SSE4.2 crc32 instruction
// when the CPU has it, else a slicing-by-8 table. Same values as RFC 3720's CRC32C.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft::checkpoint {

// Extends `crc` (0 for a fresh checksum) over `n` bytes: crc32c(b, crc32c(a)) equals the
// checksum of a followed by b.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace weft::checkpoint
