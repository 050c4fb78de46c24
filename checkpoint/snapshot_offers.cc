// In-memory snapshots, the reader's side when a world forms (snapshot_offers.h).
#include "checkpoint/snapshot_offers.h"

#include <chrono>
#include <optional>

#include "base/check.h"
#include "base/error.h"
#include "checkpoint/snapshot_views.h"
#include "checkpoint/snapshot_writer.h"

namespace weft::checkpoint {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::vector<SnapshotMeta> SnapshotOffers::add(const std::string& name, const std::string& job_id) {
  return add(std::make_shared<const SnapshotSegment>(SnapshotSegment::open(name, false)), job_id,
             false);
}

std::vector<SnapshotMeta> SnapshotOffers::add(std::shared_ptr<const SnapshotSegment> seg,
                                              const std::string& job_id, bool mapped_in) {
  // Every committed slot: the newer may be of a step some other rank never finished (killed
  // mid-step, or mid-copy), an older one is then the step everybody has. Headers first, all
  // of them, so that a corrupt header offers nothing of the segment.
  std::vector<SnapshotSegment::View> views;
  for (int slot = 0; slot < seg->slots(); ++slot)
    if (std::optional<SnapshotSegment::View> v = seg->slot(slot); v && v->meta.job_id == job_id)
      views.push_back(*v);
  std::vector<SnapshotMeta> out;
  for (const SnapshotSegment::View& v : views)
    if (offered_.emplace(std::make_pair(v.meta.rank, v.meta.step), Offered{seg, v.slot, mapped_in}).second)
      out.push_back(v.meta);
  return out;
}

std::vector<core::Tensor> SnapshotOffers::read(int rank, int64_t step,
                                               const parallel::RankLayout& layout) {
  auto it = offered_.find({rank, step});
  if (it == offered_.end())
    throw InternalError(str("old rank ", rank, "'s snapshot of step ", step,
                            " was not offered by this worker"));
  const std::shared_ptr<const SnapshotSegment>& shared = it->second.segment;
  const SnapshotSegment& seg = *shared;
  const int slot = it->second.slot;
  const std::string where = str("snapshot slot ", slot, " of ", seg.name(), " (old rank ", rank,
                                ", step ", step, ") not read: ");
  std::optional<SnapshotSegment::View> v;
  try {
    v = seg.slot(slot);
  } catch (const IoError& e) {
    throw IoError(where + e.what());
  }
  if (!v || v->meta.step != step || v->meta.rank != rank)
    throw IoError(where + "the slot was rewritten while the world formed");
  // Only this slot's pages (populate says why), in one call rather than a fault per page.
  auto t = std::chrono::steady_clock::now();
  if (!it->second.mapped_in) seg.populate(*v);
  map_s_ += seconds_since(t);
  t = std::chrono::steady_clock::now();
  try {
    std::vector<core::Tensor> out = view_snapshot(shared, *v, layout);
    copy_s_ += seconds_since(t);
    bytes_read_ += v->meta.payload_bytes;
    read_.push_back({shared, slot, v->meta.sequence, step});
    return out;
  } catch (const IoError& e) {
    copy_s_ += seconds_since(t);
    throw IoError(where + e.what());
  }
}

std::string SnapshotOffers::segment_of(int rank, int64_t step) const {
  auto it = offered_.find({rank, step});
  return it == offered_.end() ? std::string() : it->second.segment->name();
}

std::vector<SnapshotOffers::ReadSlot> SnapshotOffers::read_slots() const {
  std::vector<ReadSlot> out;
  for (const Read& r : read_) out.push_back({r.segment->name(), r.slot, r.step});
  return out;
}

std::string SnapshotOffers::rewritten() const {
  std::string out;
  for (const Read& r : read_)
    if (r.segment->sequence(r.slot) != r.sequence)
      out += str(out.empty() ? "" : "; ", "snapshot slot ", r.slot, " of ", r.segment->name(),
                 " (step ", r.step, ") was rewritten after it was verified");
  return out;
}

void agree_slots_unchanged(const SnapshotOffers& offers, comm::Communicator* world) {
  const std::string mine = offers.rewritten();
  if (!world) {
    if (!mine.empty())
      throw IoError(mine + ": the state moved from it may not be the verified one");
    return;
  }
  // One flag per rank, so that the others can name the readers.
  core::Tensor flags = core::Tensor::zeros({world->size()}, core::DType::kI64);
  flags.data<int64_t>()[world->rank()] = mine.empty() ? 0 : 1;
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  world->all_reduce(flags, o).wait();
  std::string readers;
  for (int r = 0; r < world->size(); ++r)
    if (flags.data<int64_t>()[r] != 0) readers += str(readers.empty() ? "" : ", ", r);
  if (!mine.empty())
    throw IoError(mine +
                  ": the state moved from it (kept here or sent to other ranks) may not "
                  "be the verified one");
  if (!readers.empty())
    throw IoError(str("a snapshot slot read by rank(s) ", readers,
                      " was rewritten during the move: the state received from it may not be "
                      "the verified one"));
}

void SnapshotOffers::clear() {
  offered_.clear();
  read_.clear();
  bytes_read_ = 0;
  map_s_ = copy_s_ = 0;
}

}  // namespace weft::checkpoint
