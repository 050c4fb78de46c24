// CRC-32C (Castagnoli), the checksum of checkpoint shards and snapshot blocks: ISA-L's
// crc32_iscsi from 256 bytes up when the CPU has SSE4.2, below that (or without ISA-L) the
// crc32 instruction, else a slicing-by-8 table. Same values as RFC 3720's CRC32C.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft::checkpoint {

// Extends `crc` (0 for a fresh checksum) over `n` bytes: crc32c(b, crc32c(a)) equals the
// checksum of a followed by b.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace weft::checkpoint
