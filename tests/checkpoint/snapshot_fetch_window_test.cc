// FetchWindow (checkpoint/snapshot_fetch_window.h): the pieces of an erasure-coded rebuild
// fetched over several lanes arrive in any order, and each decodes once all of its sources
// arrived, not after the pieces before it; a piece's buffer set is reused only once the piece
// before it in that set decoded; a failed fetch stops the lanes and reaches the decoder.
#include "checkpoint/snapshot_fetch_window.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace weft::checkpoint {
namespace {

TEST(FetchWindow, PiecesArrivingOutOfOrderDecodeAsTheirSourcesComplete) {
  // Four pieces, two sources each, four sets: every piece can be fetched at once.
  FetchWindow w({{0, 1}, {0, 1}, {0, 1}, {0, 1}}, 2, 4);
  for (int64_t p = 0; p < 4; ++p) {
    EXPECT_EQ(w.next_fetch(0), p);
    EXPECT_EQ(w.next_fetch(1), p);
  }
  EXPECT_EQ(w.next_fetch(0), -1) << "every piece of source 0 was handed out";
  // Arrivals in reverse order, piece 3 complete first, piece 0 last.
  w.arrived(3, 1);
  w.arrived(3, 0);
  w.arrived(2, 0);
  EXPECT_EQ(w.next_decode(), 3) << "piece 3 has both sources; 0 to 2 do not";
  w.arrived(1, 1);
  w.arrived(1, 0);
  EXPECT_EQ(w.next_decode(), 1);
  w.decoded(3);
  w.arrived(2, 1);
  w.arrived(0, 0);
  EXPECT_EQ(w.next_decode(), 2) << "piece 0 still lacks source 1";
  w.arrived(0, 1);
  EXPECT_EQ(w.next_decode(), 0);
  w.decoded(1);
  w.decoded(2);
  w.decoded(0);
  EXPECT_EQ(w.next_decode(), -1) << "every piece decoded";
}

TEST(FetchWindow, APiecesBufferSetIsReusedOnlyOnceThePieceBeforeItInTheSetDecoded) {
  // Five pieces, one source, two sets: piece 2 shares piece 0's buffers, piece 3 piece 1's.
  FetchWindow w({{0}, {0}, {0}, {0}, {0}}, 1, 2);
  EXPECT_EQ(w.next_fetch(0), 0);
  EXPECT_EQ(w.next_fetch(0), 1);
  EXPECT_FALSE(w.can_fetch(0)) << "piece 2's set holds piece 0, not decoded yet";
  w.arrived(1, 0);
  EXPECT_EQ(w.next_decode(), 1);
  w.decoded(1);
  EXPECT_FALSE(w.can_fetch(0)) << "piece 1 decoding frees piece 3's set, not piece 2's";
  w.arrived(0, 0);
  EXPECT_EQ(w.next_decode(), 0);
  w.decoded(0);
  EXPECT_TRUE(w.can_fetch(0));
  EXPECT_EQ(w.next_fetch(0), 2);
  EXPECT_EQ(w.next_fetch(0), 3) << "piece 1 decoded: its set is free for piece 3";
  EXPECT_FALSE(w.can_fetch(0));
}

TEST(FetchWindow, PiecesReadInPlaceNeedNoFetchAndALaneSkipsThem) {
  // Piece 1 needs nothing (its sources are read in place), piece 2 only source 1.
  FetchWindow w({{0, 1}, {}, {1}}, 2, 4);
  EXPECT_EQ(w.next_decode(), 1);
  EXPECT_EQ(w.next_fetch(0), 0);
  EXPECT_EQ(w.next_fetch(0), -1) << "source 0 is needed by piece 0 only";
  EXPECT_EQ(w.next_fetch(1), 0);
  EXPECT_EQ(w.next_fetch(1), 2);
  w.arrived(2, 1);
  EXPECT_EQ(w.next_decode(), 2);
}

TEST(FetchWindow, AFailedFetchStopsTheLanesAndReachesTheDecoder) {
  // Three lanes of one source over eight pieces and two sets: the lanes wait for sets while
  // the decoder decodes; the fetch of piece 3 fails (the peer was killed mid-stream).
  std::vector<std::vector<int>> needs(8, std::vector<int>{0});
  FetchWindow w(needs, 1, 2);
  std::atomic<int> fetched{0};
  std::vector<std::thread> lanes;
  for (int k = 0; k < 3; ++k)
    lanes.emplace_back([&] {
      try {
        for (int64_t p; (p = w.next_fetch(0)) >= 0;) {
          if (p == 3) throw std::runtime_error("node 0 closed the connection mid-fetch");
          fetched++;
          w.arrived(p, 0);
        }
      } catch (...) {
        w.fail(std::current_exception());
      }
    });
  int decoded = 0;
  try {
    for (int64_t p; (p = w.next_decode()) >= 0;) {
      w.decoded(p);
      ++decoded;
    }
    ADD_FAILURE() << "the decoder finished although piece 3 never arrived";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "node 0 closed the connection mid-fetch");
  }
  w.stop();
  for (auto& t : lanes) t.join();  // every lane left: none waits on a set forever
  // Piece 5 and up wait for piece 3's set (two sets), which is never freed: at most pieces
  // 0, 1, 2 and 4 are fetched and decoded.
  EXPECT_LE(decoded, 4);
  EXPECT_LE(fetched.load(), 4);
  EXPECT_EQ(w.next_fetch(0), -1);
}

}  // namespace
}  // namespace weft::checkpoint
