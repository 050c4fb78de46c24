// In-memory snapshots, the worker's side: the background copy with its checksums, and the
// read back.
#include "checkpoint/snapshot_writer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "base/error.h"
#include "base/stream_copy.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/split_in_two.h"
#include "checkpoint/snapshot_views.h"

namespace weft::checkpoint {
namespace {

// The copies' unit, in and out: fits in L2 and never crosses a checksum block.
constexpr int64_t kPiece = 256 * 1024;
static_assert(kSnapshotBlockBytes % kPiece == 0, "pieces tile checksum blocks");

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int64_t snapshot_payload_bytes(const parallel::RankLayout& layout) {
  int64_t n = 0;
  for (const parallel::LocalTensor& t : layout.locals) n += t.bytes();
  return n;
}

uint64_t snapshot_layout_hash(const parallel::RankLayout& layout) {
  std::vector<BoxKey> keys;
  keys.reserve(layout.boxes.size());
  for (const parallel::StateBox& b : layout.boxes) keys.push_back({b.state, b.start, b.extent});
  return layout_hash(keys);
}

SnapshotWriter::SnapshotWriter(SnapshotSegment segment) : segment_(std::move(segment)) {}

SnapshotWriter::~SnapshotWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: snapshot into %s failed: %s\n", segment_.name().c_str(), e.what());
  }
}

void SnapshotWriter::start(SnapshotMeta meta, std::vector<core::Tensor> tensors) {
  wait();
  int64_t bytes = 0;
  for (const core::Tensor& t : tensors) {
    WEFT_CHECK(t.is_contiguous() && t.device().is_cpu(),
               "a snapshot copies contiguous host tensors");
    bytes += int64_t(t.nbytes());
  }
  if (bytes > segment_.capacity())
    throw InternalError("snapshot of " + std::to_string(bytes) + " bytes does not fit segment " +
                        segment_.name() + " (" + std::to_string(segment_.capacity()) + " bytes)");
  meta.payload_bytes = bytes;
  auto* dst = static_cast<uint8_t*>(segment_.begin(meta));
  tensors_ = std::move(tensors);
  error_ = nullptr;
  crcs_.assign(size_t((bytes + kSnapshotBlockBytes - 1) / kSnapshotBlockBytes), 0);
  // In pieces that fit in L2 and never cross a checksum block: checksum a piece of the
  // state (which reads it into L2), then stream it out to the slot past the caches
  // (stream_copy.h). One read of the state, no read of the slot, and the training's working
  // set stays in cache. The state cannot change until wait(), so the checksummed bytes are
  // the copied ones.
  thread_ = std::thread([this, dst] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      int64_t at = 0;
      for (const core::Tensor& t : tensors_) {
        const auto* src = static_cast<const uint8_t*>(t.raw_data());
        int64_t left = int64_t(t.nbytes());
        while (left > 0) {
          const int64_t block = at / kSnapshotBlockBytes;
          const int64_t n = std::min(left, kPiece - at % kPiece);
          crcs_[size_t(block)] = crc32c(src, size_t(n), crcs_[size_t(block)]);
          stream_copy(dst + at, src, size_t(n));
          at += n, src += n, left -= n;
        }
      }
    } catch (...) {
      error_ = std::current_exception();
    }
    copy_s_ = seconds_since(t0);
  });
}

std::optional<SnapshotMeta> SnapshotWriter::wait() {
  if (!thread_.joinable()) return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  thread_.join();
  wait_s_ = seconds_since(t0);
  tensors_.clear();  // the state may change from here on
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return segment_.commit(crcs_);
}

SnapshotSegment SnapshotWriter::take_segment() {
  WEFT_CHECK(!thread_.joinable(), "take_segment() of ", segment_.name(),
             " while a snapshot copy is in flight");
  return std::move(segment_);
}

std::vector<core::Tensor> read_snapshot(const SnapshotSegment& segment,
                                        const SnapshotSegment::View& view,
                                        const parallel::RankLayout& layout) {
  check_slot_layout(segment, view, layout);
  // Copy, then checksum the copies (the bytes taken are the bytes verified), block by block
  // across tensor boundaries as the writer did, in pieces that fit in L2: each piece is
  // checksummed while its copy is still in cache, so the payload is read from the segment
  // once and its copy is not read back from memory.
  const std::vector<uint32_t> recorded = segment.block_crc32c(view);
  std::vector<uint32_t> crcs(recorded.size(), 0);
  std::vector<core::Tensor> out;
  out.reserve(layout.locals.size());
  struct Run {  // payload bytes [at, at + n) go to dst
    uint8_t* dst;
    int64_t at, n;
  };
  std::vector<Run> runs;
  int64_t total = 0;
  for (const parallel::LocalTensor& l : layout.locals) {
    core::Tensor t = core::Tensor::empty(l.shape, l.dtype);
    runs.push_back({static_cast<uint8_t*>(t.raw_data()), total, l.bytes()});
    total += l.bytes();
    out.push_back(std::move(t));
  }
  const auto* src = static_cast<const uint8_t*>(view.payload);
  // Payload bytes [from, to), `from` on a block: each block is checksummed by one thread, in
  // order. A fresh destination is mapped in just before its bytes are copied.
  auto copy = [&](int64_t from, int64_t to) {
    for (const Run& r : runs) {
      const int64_t lo = std::max(r.at, from), hi = std::min(r.at + r.n, to);
      if (lo >= hi) continue;
      uint8_t* dst = r.dst + (lo - r.at);
      populate_for_write(dst, hi - lo);
      for (int64_t at = lo; at < hi;) {
        const int64_t block = at / kSnapshotBlockBytes;
        const int64_t n = std::min(hi - at, kPiece - at % kPiece);
        std::memcpy(dst, src + at, size_t(n));
        if (size_t(block) < crcs.size())
          crcs[size_t(block)] = crc32c(dst, size_t(n), crcs[size_t(block)]);
        at += n, dst += n;
      }
    }
  };
  // A large slot is copied by two threads, each half of its blocks (split_in_two.h).
  split_in_two(total, kSnapshotBlockBytes, copy);
  check_slot_read(segment, view, crcs, recorded);
  return out;
}

}  // namespace weft::checkpoint
