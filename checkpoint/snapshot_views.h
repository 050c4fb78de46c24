// In-memory snapshots, the zero-copy read (issue 15): a committed slot's payload handed to
// the router as tensors that are views of the reader's mapping of the segment, verified
// first, instead of copies into fresh memory.
//
// Why: a new world's survivor that reads a snapshot only passes it to the router, which
// copies what it needs into the new layout's tensors anyway. Copying the slot out first
// wrote every byte into fresh pages (a page fault per 4 KiB page: 0.5-1.5 GB/s here, against
// 18 GB/s for memcpy into touched memory) just to read them again; on the busiest survivor
// of a node loss that was 806 MiB. A view costs the mapping-in of the slot's pages (which
// the copy needed too) and one checksum pass over them (33 GB/s).
//
// The bytes verified are the bytes the router reads only while nobody writes the slot: the
// reader's own data segment is written by its own worker alone (after the world is
// entered), a replica's or a rebuilt one's by the agent, for a node that is gone or about a
// snapshot newer than any step a world chooses (SnapshotOffers::rewritten() says whether it
// held). A view must not outlive the world's entry: own_snapshot_views copies out any that
// the router hands back, whose mapping is read-only (or the agent's slot, for the rank's own
// writer's mapping).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "checkpoint/snapshot_segment.h"
#include "core/tensor.h"
#include "memory/allocator.h"
#include "parallel/vps.h"

namespace weft::checkpoint {

// Tensors of `layout`'s locals (the rank the slot was taken of, in the world it was taken
// in) that view the committed slot `view` of `segment` in place, every block's crc32c
// checked against the slot's first, by two threads for a large slot (a caller maps the
// slot's pages in before, SnapshotSegment::populate, or the check faults them in one by one). Each view keeps `segment` mapped while it lives. IoError naming
// the segment when the slot's layout hash or payload size is not the layout's, a block does
// not match its checksum (how many, the first's byte, the step), or the slot was rewritten
// while it was checked.
std::vector<core::Tensor> view_snapshot(std::shared_ptr<const SnapshotSegment> segment,
                                        const SnapshotSegment::View& view,
                                        const parallel::RankLayout& layout);

// The checks of every read of a slot (view_snapshot here, read_snapshot's copy): before it,
// that `view` holds `layout`'s boxes (its layout hash and payload size); after it, that
// `crcs` (computed over the bytes read) equal the slot's `recorded` ones and the slot was
// not rewritten meanwhile. IoError naming the segment otherwise, as view_snapshot says.
void check_slot_layout(const SnapshotSegment& segment, const SnapshotSegment::View& view,
                       const parallel::RankLayout& layout);
void check_slot_read(const SnapshotSegment& segment, const SnapshotSegment::View& view,
                     const std::vector<uint32_t>& crcs, const std::vector<uint32_t>& recorded);

// Whether `t`'s bytes lie in a live view that view_snapshot made.
bool is_snapshot_view(const core::Tensor& t);

// Replaces every tensor of `tensors` that is a snapshot view (is_snapshot_view) by a copy of
// its bytes in memory of `alloc` (null: the host allocator), mapped in before it is written
// and copied by two threads when large; undefined and other tensors are left as they are.
// Returns the bytes copied. For what the router hands back: a destination that is a whole
// source tensor is adopted, not copied (parallel/router.h), and a view adopted so would
// leave the trainer's state in the agent's read-only segment.
int64_t own_snapshot_views(std::vector<core::Tensor>& tensors, memory::Allocator* alloc = nullptr);

// Bytes of `n` at `p` mapped in for writing ahead (MADV_POPULATE_WRITE, Linux 5.14, in
// pieces: base/populate.h) rather than a fault per page inside the copy that follows: 403 MiB of fresh tensors took
// 130-170 ms that way and 200-250 ms as faults in memcpy (load 5); memory already touched
// costs a walk of its page table. A failure leaves the pages to fault in as they are
// written. Does nothing below 1 MiB.
void populate_for_write(void* p, int64_t n);

}  // namespace weft::checkpoint
