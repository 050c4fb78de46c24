// The holders' reports of a forming world (launch/live_resize.h, exchange_reports): two ranks
// as two threads of this process on a loopback store. What a stopped move leaves travels
// whole: each piece's locals and the boxes of the tensors that arrived in part
// (HeldPiece::partial, of any rank of dimensions), alike on every rank, with the offers after
// the live reports.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/tcp_store_server.h"
#include "launch/live_resize.h"
#include "parallel/launch_env.h"
#include "tests/launch/world_threads.h"

namespace weft::launch {
namespace {

parallel::StateBox box(int local, std::vector<int64_t> start, std::vector<int64_t> extent,
                       std::vector<int64_t> local_start) {
  parallel::StateBox b;
  b.local = local;
  b.start = std::move(start), b.extent = std::move(extent), b.local_start = std::move(local_start);
  return b;
}

TEST(ExchangeReports, PartlyFilledTensorsTravelWithTheirBoxes) {
  // Rank 0: an old slot's tensors it had not freed (locals 0 and 2 of world 2's rank 0), and
  // world 3's rank 0 with local 1 whole and local 4 in three boxes (a scalar's, a matrix's,
  // a vector's). Rank 1: its whole state, and a snapshot it offers.
  HeldState h0;
  h0.valid = true, h0.epoch = 2, h0.rank = 0, h0.world = 2, h0.step = 41;
  h0.pieces.push_back(HeldPiece{0, 2, {0, 2}, {}, {}});
  const std::vector<parallel::StateBox> partial = {
      box(4, {}, {}, {}), box(4, {8, 0}, {4, 16}, {0, 0}), box(4, {32}, {7}, {12})};
  h0.pieces.push_back(HeldPiece{0, 3, {1, 4}, {}, partial});
  HeldState h1;
  h1.valid = true, h1.epoch = 2, h1.rank = 1, h1.world = 2, h1.step = 41;
  h1.pieces.push_back(HeldPiece{1, 2, {}, {}, {}});
  HolderReport offer;
  offer.valid = 1, offer.source = HolderReport::kSnapshot, offer.epoch = 2, offer.rank = 1;
  offer.world = 2, offer.step = 40, offer.layout_hash = 12345;

  std::vector<std::vector<HolderReport>> got(2);
  const std::vector<std::string> error =
      run_world_threads(2, 3, [&](int rank, comm::Communicator& world) {
        got[size_t(rank)] = rank == 0 ? exchange_reports(world, h0, 100)
                                      : exchange_reports(world, h1, 200, {offer});
      });
  ASSERT_TRUE(error[0].empty()) << error[0];
  ASSERT_TRUE(error[1].empty()) << error[1];
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<HolderReport>& r = got[size_t(rank)];
    // The live reports first (rank order), then rank 0's other piece, then rank 1's offer.
    ASSERT_EQ(r.size(), 4u) << "rank " << rank;
    EXPECT_EQ(r[0].holder, 0);
    EXPECT_EQ(r[0].locals, (std::vector<int>{0, 2}));
    EXPECT_TRUE(r[0].partial.empty());
    EXPECT_EQ(r[1].holder, 1);
    EXPECT_TRUE(r[1].locals.empty());
    EXPECT_TRUE(r[1].partial.empty());
    EXPECT_EQ(r[2].holder, 0);
    EXPECT_EQ(r[2].world, 3);
    EXPECT_EQ(r[2].piece, 1);
    EXPECT_EQ(r[2].step, 41);
    EXPECT_EQ(r[2].host, 100);
    EXPECT_EQ(r[2].locals, (std::vector<int>{1, 4}));
    EXPECT_EQ(r[2].partial, partial);
    EXPECT_EQ(r[3].source, HolderReport::kSnapshot);
    EXPECT_EQ(r[3].step, 40);
    EXPECT_EQ(r[3].layout_hash, 12345);
    EXPECT_EQ(r[3].host, 200);
    EXPECT_TRUE(r[3].partial.empty());
  }
}

}  // namespace
}  // namespace weft::launch
