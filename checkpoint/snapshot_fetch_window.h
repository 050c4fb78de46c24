// The pieces of one erasure-coded fragment's rebuild in flight (launch/snapshot_parity.h's
// decode_fragment): which piece each fetching lane takes next, which pieces have every source
// they need and can decode, and when a piece's buffers are free again.
//
// A fragment is decoded `pieces` at a time from several sources (the stripe's other
// fragments). Each source is fetched by several lanes at once (a connection each), so pieces
// arrive in any order: a piece decodes as soon as all of its sources arrived, not after the
// pieces before it. Piece p is held in buffer set p % sets, so a lane takes piece p only once
// piece p - sets has decoded. One fetch that fails fails the whole window: every lane stops at
// its next piece and the decoder rethrows the failure.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

namespace weft::checkpoint {

class FetchWindow {
 public:
  // `needs[p]`: the sources piece p must fetch (a piece read in place needs none of them);
  // sources are numbered 0 .. sources - 1. `sets` >= 1.
  FetchWindow(const std::vector<std::vector<int>>& needs, int sources, int sets);

  // A lane of `source`: the next piece it fetches from that source, waiting until the piece's
  // buffer set is free; -1 when none is left or the window failed or stopped.
  int64_t next_fetch(int source);
  // Without waiting: whether next_fetch(source) would hand out a piece now.
  bool can_fetch(int source) const;
  // Piece `piece` of `source` arrived in its buffers.
  void arrived(int64_t piece, int source);
  // A lane's fetch failed: the first failure is kept and every waiter wakes.
  void fail(std::exception_ptr e);
  // No more pieces are handed out (the decoder is leaving); lanes see -1.
  void stop();

  // The decoder: a piece all of whose sources arrived and that has not decoded yet (the
  // lowest such), waiting for one; -1 once every piece decoded. Rethrows a lane's failure.
  int64_t next_decode();
  // Piece `piece` decoded: its buffer set is free for piece + sets.
  void decoded(int64_t piece);

 private:
  bool set_free(int64_t piece) const;  // under mu_
  int64_t next_of(int source) const;   // under mu_: its next piece needing it, or pieces_
  const int64_t pieces_;
  const int sets_;
  std::vector<std::vector<int>> needs_;
  std::vector<int> missing_;     // per piece: its sources not arrived yet
  std::vector<char> decoded_;    // per piece
  std::vector<char> handed_;     // per piece: handed to the decoder
  std::vector<int64_t> cursor_;  // per source: the lowest piece not handed to a lane
  int64_t done_ = 0;             // pieces decoded
  bool stopped_ = false;
  std::exception_ptr failed_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace weft::checkpoint
