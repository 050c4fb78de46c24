// Non-temporal copies (stream_copy.h).
#include "base/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace weft {

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  // Below a few pages the cache bypass buys nothing and the fence costs more than it saves.
  constexpr size_t kSmall = 16 * 1024;
  if (n < kSmall) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Plain copy up to the destination's first 64-byte line, then whole lines.
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
#if defined(__AVX__)
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
#else
    for (int k = 0; k < 64; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
#endif
  }
  std::memcpy(d, s, n);
  _mm_sfence();  // non-temporal stores are weakly ordered: order them before what follows
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace weft
