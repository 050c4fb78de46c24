// In-memory snapshots, the reader's side when a world forms (issue 15): the committed slots a
// worker offers, known from their headers alone, and the read of the ones the world chooses.
//
// A survivor sees every committed slot of its node's segments (two or three per segment, own
// and replicas), but the holders' choice (launch/live_resize.h) uses at most one per old rank.
// Offering from the slot headers touches only the segments' header pages; a chosen slot's
// payload is mapped in and checksummed once, in the pass that copies it out. A corrupt block
// is then found by the rank that reads it, which the world learns by its vote and chooses
// again without that slot (live_resize.h, choose_and_read).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/snapshot_segment.h"
#include "comm/communicator.h"
#include "core/tensor.h"
#include "parallel/vps.h"

namespace weft::checkpoint {

class SnapshotOffers {
 public:
  // Opens segment `name` read-only and offers each committed slot of job `job_id` whose
  // (rank, step) is not offered yet (two epochs' segments of one rank may hold one step):
  // their metas, read from the slot headers. No payload page is mapped in and nothing is
  // checksummed here. IoError naming the segment when it cannot be opened or a committed
  // slot's header is inconsistent (then none of its slots is offered).
  std::vector<SnapshotMeta> add(const std::string& name, const std::string& job_id);
  // The same through a mapping this process already has. `mapped_in`: its written slots'
  // pages are mapped in already (the rank's own last writer's mapping), so a read does not
  // ask for them again: populate walks present pages at about the cost of mapping them in
  // (17-44 ms for 403 MiB here, against 15 ms for the whole checksum pass that follows),
  // and a page that is not present after all faults in as the pass reads it.
  std::vector<SnapshotMeta> add(std::shared_ptr<const SnapshotSegment> segment,
                                const std::string& job_id, bool mapped_in);

  // Old rank `rank`'s offered snapshot of `step`, `layout`'s locals (the rank's layout in the
  // world the snapshot was taken in), as views of the slot in place (snapshot_views.h): that
  // slot's payload mapped in and every block's checksum verified, no copy. IoError naming the
  // segment, the slot and the step when a block does not match its checksum, the slot was
  // rewritten, or the layout is another; InternalError when the snapshot was not offered
  // here. The views keep their segment mapped after clear(); rewritten() says whether the
  // slots stayed as they were verified.
  std::vector<core::Tensor> read(int rank, int64_t step, const parallel::RankLayout& layout);

  // The slots read since the last clear() that were rewritten since (one line naming each),
  // "" when none was: a view's bytes were the ones verified only if nobody wrote its slot
  // before the view was last read.
  std::string rewritten() const;

  // The slots read since the last clear(), in the order read: which slot of which segment,
  // and the step it held when verified.
  struct ReadSlot {
    std::string segment;
    int slot = 0;
    int64_t step = 0;
  };
  std::vector<ReadSlot> read_slots() const;

  // The segment that holds old rank `rank`'s offered snapshot of `step` ("" when none does).
  std::string segment_of(int rank, int64_t step) const;

  // Unmaps every offered segment.
  void clear();
  size_t size() const { return offered_.size(); }
  // Since the last clear(): the payload bytes of the slots read whole, each verified once (a
  // read that fails is not counted), and the seconds spent mapping slots in and verifying
  // their checksums (copy_seconds: the check; nothing is copied).
  int64_t bytes_read() const { return bytes_read_; }
  double map_seconds() const { return map_s_; }
  double copy_seconds() const { return copy_s_; }

 private:
  struct Offered {
    std::shared_ptr<const SnapshotSegment> segment;
    int slot = 0;
    bool mapped_in = false;  // add()'s: no populate before a read
  };
  std::map<std::pair<int, int64_t>, Offered> offered_;  // by (old rank, step)
  struct Read {
    std::shared_ptr<const SnapshotSegment> segment;
    int slot = 0;
    int64_t sequence = 0, step = 0;
  };
  std::vector<Read> read_;  // the slots read whole since the last clear()
  int64_t bytes_read_ = 0;
  double map_s_ = 0, copy_s_ = 0;
};

// After a move whose sources were views of `offers`' slots (the router's copies out of them,
// and own_snapshot_views for the ones it adopted whole): whether every slot read stayed as it
// was verified. A slot rewritten meanwhile (a newer snapshot committed into it, or a writer
// still in it) may have given the move bytes that are not the verified ones, and not only to
// its reader: the router sent them to other ranks too. So with `world` every rank of the move
// calls this (a collective, after the same move) and learns of every rank's slots; null: this
// rank's own only (the world's connections are gone). IoError on every rank when one was
// rewritten: the reader's names the segment, slot and step (rewritten()), the others' name
// the reader's rank.
void agree_slots_unchanged(const SnapshotOffers& offers, comm::Communicator* world);

}  // namespace weft::checkpoint
