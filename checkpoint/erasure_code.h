// Reed-Solomon erasure coding over GF(2^8) for the in-memory snapshots (issue 15): k data
// fragments, m parity fragments from a Cauchy matrix through ISA-L; any k of the k+m
// fragments rebuild the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace weft::checkpoint {

// The code of one stripe shape (k, m). Fragment i < k is data fragment i; fragment k + j is
// parity fragment j = sum over i of C[j][i] * data[i], where C is ISA-L's Cauchy matrix
// (gf_gen_cauchy1_matrix: C[j][i] = 1 / ((k + j) xor i) in GF(2^8), polynomial 0x11d). The
// bytes are ISA-L's, so fragments written by one build decode with any other.
//
// Thread safety: encode() and reconstruct() may be called concurrently on one object (the
// cache of decode tables is behind a mutex; the coding itself runs outside it). Neither
// allocates per byte; both block until done and run on the calling thread only.
class ErasureCode {
 public:
  // Throws ConfigError naming `snapshot.ec` unless k >= 1, m >= 1 and k + m <= 255 (GF(2^8)
  // has 255 distinct nonzero elements for the Cauchy rows); NotSupported when Weft was built
  // without ISA-L (install libisal-dev, as setup.sh does, and reconfigure).
  ErasureCode(int k, int m);
  ~ErasureCode();
  ErasureCode(const ErasureCode&) = delete;
  ErasureCode& operator=(const ErasureCode&) = delete;

  int k() const { return k_; }
  int m() const { return m_; }

  // Writes the m parity fragments of the k data fragments: parity[j][0, len) from
  // data[0..k)[0, len). data.size() == k and parity.size() == m, every pointer valid for
  // len bytes (len may be 0 and any size, GBs included; no alignment needed); parity must
  // not overlap data. The caller owns every buffer. Throws InternalError on wrong counts
  // or null pointers.
  void encode(const std::vector<const uint8_t*>& data, const std::vector<uint8_t*>& parity,
              size_t len) const;

  // Adds data fragment `index`'s share to the m parity fragments: parity[j][0, len) +=
  // C[j][index] * data[0, len) (addition in GF(2^8) is xor). Starting from zeroed parity and
  // adding each of the k data fragments once, in any order and over any sub-ranges, gives
  // encode()'s parity: a holder of parity codes fragments as they arrive, one at a time,
  // without keeping them (launch/snapshot_parity.h). A fragment shorter than the others is
  // added as if padded with zeros. `parity` may be a run of rows only, [first_row, first_row
  // + parity.size()): a holder of one parity fragment computes that row alone, 1/m of the
  // work. InternalError on a wrong index, row range or null pointer.
  void encode_update(int index, const uint8_t* data, const std::vector<uint8_t*>& parity,
                     size_t len, int first_row = 0) const;

  // Rebuilds in place every fragment listed in `erased` (data or parity) from the others.
  // fragments.size() == k + m, data first then parity, each valid for len bytes; erased
  // fragments' bytes are only written, never read, so their pointers may hold garbage (they
  // must still point at len writable bytes). `erased` lists distinct indices in [0, k+m),
  // in any order; an empty list does nothing.
  // Throws IoError when more than m fragments are erased: the stripe's data is lost (the
  // recovery path catches it and falls back to the durable checkpoint). Throws
  // InternalError on wrong counts, null pointers, or a repeated or out-of-range index.
  void reconstruct(const std::vector<uint8_t*>& fragments, const std::vector<int>& erased,
                   size_t len) const;

 private:
  struct Tables;  // ISA-L's expanded multiplication tables for one set of output rows
  std::shared_ptr<const Tables> decode_tables(const std::vector<int>& erased) const;

  int k_, m_;
  std::vector<uint8_t> matrix_;           // (k+m) x k: the identity over the Cauchy rows
  std::shared_ptr<const Tables> encode_;  // the m parity rows
  // Decode tables by sorted erasure pattern; bounded (kMaxCachedPatterns in the .cc), since
  // a job sees few patterns: the nodes that failed.
  mutable std::mutex mu_;
  mutable std::map<std::vector<int>, std::shared_ptr<const Tables>> decode_cache_;
};

}  // namespace weft::checkpoint
