// Reed-Solomon over GF(2^8) through ISA-L: the Cauchy matrix, its encode tables made once,
// decode tables per erasure pattern (a k x k inverse, cached), and chunked coding.
#include "checkpoint/erasure_code.h"

#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/config.h"
#include "base/error.h"

#if WEFT_HAVE_ISAL
#include <isa-l/erasure_code.h>
#endif

namespace weft::checkpoint {

struct ErasureCode::Tables {
  int rows = 0;              // output fragments these tables compute
  std::vector<int> sources;  // decode only: the k surviving fragments read, ascending
  std::vector<uint8_t> g;    // ISA-L's expanded tables: 32 * k * rows bytes
};

namespace {

// Enough for every pattern of up to 2 failures in a 16-node stripe; past it one old entry
// goes. Building one costs a k x k inversion: microseconds, against a reconstruct of MiBs.
constexpr size_t kMaxCachedPatterns = 256;

// ISA-L reads the sources once per group of (at most 4 to 6) output rows, 64 bytes at a
// time. On long buffers a chunk whose working set (sources + outputs) fits in half of L2
// (1 MiB per core here) keeps those repeated passes, and the outputs' write-allocate, in
// cache. Measured on this machine (AMD EPYC, AVX-512, best of 9, 32 MiB fragments, GB/s of
// data encoded by one thread), chunk = 16 KiB / 32 KiB / 256 KiB / 1 MiB / whole buffer:
//   (k,m) = (2,1):  25.0 / 22.5 / 24.7 / 25.1 / 24.8   (one pass: memory-bound either way)
//           (4,2):  19.5 / 20.4 / 20.4 / 20.2 / 17.8
//           (8,8):   7.1 /  7.5 /  5.7 /  5.9 /  5.7   (two passes over the sources)
//          (10,12):  5.9 /  5.6 /  5.4 /  4.9 /  4.7
// Chunks also keep every ISA-L call under its `int` length, so buffers of GBs work.
constexpr size_t kWorkingSetBytes = size_t(512) << 10;
constexpr size_t kMinChunkBytes = size_t(16) << 10, kMaxChunkBytes = size_t(256) << 10;

#if WEFT_HAVE_ISAL
size_t chunk_bytes(int sources, int rows) {
  size_t c = kWorkingSetBytes / size_t(sources + rows);
  c = std::clamp(c, kMinChunkBytes, kMaxChunkBytes);
  return c & ~size_t(4095);  // whole pages: every chunk starts as aligned as the buffer
}

// outputs[r][0, len) = sum over s of coefficient(r, s) * sources[s][0, len), chunk by chunk.
void run_tables(const std::vector<uint8_t>& g, int nsources, int rows,
                const std::vector<const uint8_t*>& sources, const std::vector<uint8_t*>& outputs,
                size_t len) {
  const size_t chunk = chunk_bytes(nsources, rows);
  std::vector<unsigned char*> src(static_cast<size_t>(nsources)), dst(static_cast<size_t>(rows));
  // ISA-L's signature is not const-correct: it reads the tables and sources only.
  auto* tables = const_cast<unsigned char*>(g.data());
  for (size_t off = 0; off < len; off += chunk) {
    const size_t n = std::min(chunk, len - off);
    for (int s = 0; s < nsources; ++s)
      src[size_t(s)] = const_cast<uint8_t*>(sources[size_t(s)]) + off;
    for (int r = 0; r < rows; ++r) dst[size_t(r)] = outputs[size_t(r)] + off;
    ec_encode_data(int(n), nsources, rows, tables, src.data(), dst.data());
  }
}
#endif

}  // namespace

ErasureCode::ErasureCode(int k, int m) : k_(k), m_(m) {
  if (k < 1 || m < 1 || k + m > 255)
    throw ConfigError("snapshot.ec", str("k=", k, ", m=", m,
                                         " is not a Reed-Solomon code over GF(2^8): need k >= 1 "
                                         "data and m >= 1 parity fragments with k + m <= 255 (e.g. "
                                         "`snapshot.ec: {k: 2, m: 1}`)"));
#if WEFT_HAVE_ISAL
  const int n = k + m;
  matrix_.resize(size_t(n * k));
  gf_gen_cauchy1_matrix(matrix_.data(), n, k);
  auto enc = std::make_shared<Tables>();
  enc->rows = m;
  enc->g.resize(size_t(32 * k * m));
  ec_init_tables(k, m, matrix_.data() + size_t(k * k), enc->g.data());
  encode_ = std::move(enc);
#else
  throw NotSupported(
      "snapshot.redundancy: ec needs ISA-L, and this Weft was built without it: install "
      "libisal-dev (setup.sh does) and reconfigure with cmake");
#endif
}

ErasureCode::~ErasureCode() = default;

void ErasureCode::encode(const std::vector<const uint8_t*>& data,
                         const std::vector<uint8_t*>& parity, size_t len) const {
  WEFT_CHECK(int(data.size()) == k_ && int(parity.size()) == m_, "ErasureCode(", k_, ",", m_,
             ")::encode: got ", data.size(), " data and ", parity.size(), " parity fragments");
  for (const uint8_t* p : data) WEFT_CHECK(p != nullptr, "ErasureCode::encode: null data fragment");
  for (const uint8_t* p : parity)
    WEFT_CHECK(p != nullptr, "ErasureCode::encode: null parity fragment");
#if WEFT_HAVE_ISAL
  run_tables(encode_->g, k_, m_, data, parity, len);
#else
  (void)len;
#endif
}

void ErasureCode::encode_update(int index, const uint8_t* data,
                                const std::vector<uint8_t*>& parity, size_t len,
                                int first_row) const {
  const int rows = int(parity.size());
  WEFT_CHECK(index >= 0 && index < k_, "ErasureCode(", k_, ",", m_,
             ")::encode_update: data fragment ", index, " outside [0, ", k_, ")");
  WEFT_CHECK(first_row >= 0 && rows >= 1 && first_row + rows <= m_, "ErasureCode(", k_, ",", m_,
             ")::encode_update: parity rows [", first_row, ", ", first_row + rows,
             ") outside [0, ", m_, ")");
  WEFT_CHECK(data != nullptr, "ErasureCode::encode_update: null data fragment");
  for (const uint8_t* p : parity)
    WEFT_CHECK(p != nullptr, "ErasureCode::encode_update: null parity fragment");
#if WEFT_HAVE_ISAL
  const size_t chunk = chunk_bytes(1, rows);
  std::vector<unsigned char*> dst(static_cast<size_t>(rows));
  // ISA-L's tables hold 32 bytes per (output row, source): row r's start at r * k * 32, so
  // a subset of consecutive rows is a sub-table and costs only its own rows.
  auto* tables = const_cast<unsigned char*>(encode_->g.data()) + size_t(first_row) * size_t(k_) * 32;
  for (size_t off = 0; off < len; off += chunk) {
    const size_t n = std::min(chunk, len - off);
    for (int r = 0; r < rows; ++r) dst[size_t(r)] = parity[size_t(r)] + off;
    ec_encode_data_update(int(n), k_, rows, index, tables, const_cast<uint8_t*>(data) + off,
                          dst.data());
  }
#else
  (void)len;
#endif
}

std::shared_ptr<const ErasureCode::Tables> ErasureCode::decode_tables(
    const std::vector<int>& erased) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = decode_cache_.find(erased);
    if (it != decode_cache_.end()) return it->second;
  }
  auto t = std::make_shared<Tables>();
#if WEFT_HAVE_ISAL
  const size_t k = size_t(k_);
  t->rows = int(erased.size());
  // The first k survivors; their rows of the code matrix map data to them, so the inverse
  // maps them back to data.
  for (int i = 0, e = 0; int(t->sources.size()) < k_; ++i) {
    if (e < int(erased.size()) && erased[size_t(e)] == i)
      ++e;
    else
      t->sources.push_back(i);
  }
  std::vector<uint8_t> survivors(k * k), inverse(k * k);
  for (size_t r = 0; r < k; ++r)
    std::copy_n(&matrix_[size_t(t->sources[r]) * k], k, &survivors[r * k]);
  // Any k rows of [I; Cauchy] are independent, so a failure here is a bug, not bad data.
  WEFT_CHECK(gf_invert_matrix(survivors.data(), inverse.data(), k_) == 0,
             "ErasureCode: singular decode matrix for k=", k_, ", m=", m_);
  // Row of an erased fragment as a function of the survivors: a data fragment's is its row
  // of the inverse; a parity fragment's is its code row times the inverse.
  std::vector<uint8_t> rows(erased.size() * k);
  for (size_t r = 0; r < erased.size(); ++r) {
    const size_t e = size_t(erased[r]);
    uint8_t* out = &rows[r * k];
    if (e < k) {
      std::copy_n(&inverse[e * k], k, out);
      continue;
    }
    for (size_t j = 0; j < k; ++j) {
      uint8_t acc = 0;
      for (size_t i = 0; i < k; ++i) acc ^= gf_mul(matrix_[e * k + i], inverse[i * k + j]);
      out[j] = acc;
    }
  }
  t->g.resize(32 * k * erased.size());
  ec_init_tables(k_, t->rows, rows.data(), t->g.data());
#endif
  std::lock_guard<std::mutex> lock(mu_);
  if (decode_cache_.size() >= kMaxCachedPatterns) decode_cache_.erase(decode_cache_.begin());
  decode_cache_.emplace(erased, t);
  return t;
}

void ErasureCode::reconstruct(const std::vector<uint8_t*>& fragments,
                              const std::vector<int>& erased, size_t len) const {
  const int n = k_ + m_;
  WEFT_CHECK(int(fragments.size()) == n, "ErasureCode(", k_, ",", m_, ")::reconstruct: got ",
             fragments.size(), " fragments, expected k + m = ", n);
  for (const uint8_t* p : fragments)
    WEFT_CHECK(p != nullptr, "ErasureCode::reconstruct: null fragment");
  std::vector<int> sorted = erased;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    WEFT_CHECK(sorted[i] >= 0 && sorted[i] < n, "ErasureCode::reconstruct: fragment index ",
               sorted[i], " outside [0, ", n, ")");
    WEFT_CHECK(i == 0 || sorted[i] != sorted[i - 1], "ErasureCode::reconstruct: fragment ",
               sorted[i], " listed twice as erased");
  }
  if (int(sorted.size()) > m_)
    throw IoError(str("erasure code (k=", k_, ", m=", m_, "): ", sorted.size(),
                      " fragments lost, at most ", m_, " can be rebuilt; the stripe is lost"));
  if (sorted.empty()) return;
  std::shared_ptr<const Tables> t = decode_tables(sorted);
#if WEFT_HAVE_ISAL
  std::vector<const uint8_t*> src;
  std::vector<uint8_t*> dst;
  for (int s : t->sources) src.push_back(fragments[size_t(s)]);
  for (int e : sorted) dst.push_back(fragments[size_t(e)]);
  run_tables(t->g, k_, t->rows, src, dst, len);
#else
  (void)len;
#endif
}

}  // namespace weft::checkpoint
