// Helpers shared by the files of SnapshotParity (snapshot_parity.cc, its rebuild and ring):
// reading a committed slot's bytes and checking them against the rank's block checksums.
// Internal to launch/; not an interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/snapshot_segment.h"

namespace weft::launch::parity_bytes {

double since(std::chrono::steady_clock::time_point t);
std::string mib(double bytes);

// Whether bytes [from, from + n) of a payload match the rank's block checksums; `data` holds
// them, `from` is block-aligned, `payload` is the rank's whole length.
bool blocks_match(const uint8_t* data, int64_t from, int64_t n, int64_t payload,
                  const std::vector<uint32_t>& crcs);

// The committed slot of `seg` holding `step`, the newest such (none: nullopt).
std::optional<checkpoint::SnapshotSegment::View> newest_of_step(
    const checkpoint::SnapshotSegment& seg, int64_t step);

// The committed slot of `segment` holding `step` (the newest such), read: bytes [offset,
// offset + length) of its payload into out, zeros past the payload. False when the slot was
// rewritten meanwhile; IoError when no slot holds that step.
bool read_range(const std::string& segment, int64_t step, int64_t offset, int64_t length,
                uint8_t* out);
// The same through a mapping this process holds already (its pages mapped in, no fault).
bool read_range(const checkpoint::SnapshotSegment& seg, int64_t step, int64_t offset,
                int64_t length, uint8_t* out);

}  // namespace weft::launch::parity_bytes
