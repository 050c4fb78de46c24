// What a test reads of a live job's snapshot segments while the job runs. Header-only: for
// test binaries that link weft_checkpoint.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "checkpoint/snapshot_segment.h"

namespace weft::test {

// The newest committed step of a segment (-1: none yet, or not there).
inline int64_t newest_step(const std::string& name) {
  try {
    const checkpoint::SnapshotSegment seg = checkpoint::SnapshotSegment::open(name, false);
    const std::optional<checkpoint::SnapshotSegment::View> v = seg.latest();
    return v ? v->meta.step : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace weft::test
