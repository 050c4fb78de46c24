// Tests only: a snapshot slot rewritten during a live move (snapshot_rewrite_for_tests.h).
#include "launch/snapshot_rewrite_for_tests.h"

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/env.h"
#include "base/error.h"
#include "checkpoint/snapshot_segment.h"

namespace weft::launch {
namespace {

constexpr const char* kVariable = "WEFT_TEST_REWRITE_SNAPSHOT";

// Rewrites slot `slot` of segment `name` (snapshot_rewrite_for_tests.h); returns what it did.
std::string rewrite(const std::string& name, int slot, bool commit) {
  checkpoint::SnapshotSegment seg = checkpoint::SnapshotSegment::open(name, true);
  const std::optional<checkpoint::SnapshotSegment::View> v = seg.slot(slot);
  if (!v) throw InternalError(str(kVariable, ": slot ", slot, " of ", name, " is not committed"));
  const checkpoint::SnapshotMeta read = v->meta;
  const auto* from = static_cast<const char*>(v->payload);
  const std::vector<char> bytes(from, from + read.payload_bytes);
  int recommitted = 0;
  for (int i = 0; i < seg.slots(); ++i) {
    void* p = seg.begin(read);
    if (p != v->payload) {  // another slot: the read one is still the newest, or not the oldest
      std::memcpy(p, bytes.data(), bytes.size());
      (void)seg.commit();
      ++recommitted;
      continue;
    }
    // The read slot: a writer of other bytes in it, left there or committing a newer step.
    // (begin() takes an uncommitted slot first: the one just taken.)
    checkpoint::SnapshotMeta newer = read;
    newer.step = read.step + 1;
    if (commit) {
      void* newer_payload = seg.begin(newer);
      WEFT_CHECK(newer_payload == p, kVariable, ": the writer moved to another slot");
    }
    std::memset(p, 0x7f, bytes.size());
    const std::string again = str(" after committing its snapshot again ", recommitted,
                                  " time(s) into the segment's other slots");
    if (!commit) return "a writer left in it" + again;
    (void)seg.commit();
    return str("a newer snapshot (step ", newer.step, ", other bytes) committed into it", again);
  }
  throw InternalError(str(kVariable, ": no writer took slot ", slot, " of ", name));
}

}  // namespace

std::function<void(const parallel::TransitionStats&)> snapshot_rewrite_for_tests(
    int64_t epoch, bool first_round, int rank, const checkpoint::SnapshotOffers& offers) {
  const std::string v = env_string(kVariable, "");
  if (v.empty()) return {};
  // <epoch>:<rank>:<how>
  int64_t at_epoch = -1;
  int at_rank = -1;
  std::string how;
  const size_t a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1);
  try {
    if (b != std::string::npos) {
      at_epoch = std::stoll(v.substr(0, a));
      at_rank = std::stoi(v.substr(a + 1, b - a - 1));
      how = v.substr(b + 1);
    }
  } catch (const std::exception&) {
    how.clear();
  }
  if (how != "torn" && how != "committed")
    throw ConfigError(kVariable, str("'", v, "' is not <epoch>:<rank>:torn|committed"));
  if (!first_round || at_epoch != epoch || at_rank != rank) return {};
  return [&offers, rank, commit = how == "committed",
          done = false](const parallel::TransitionStats& st) mutable {
    const int64_t messages =
        st.bytes_sent_shm + st.bytes_received_shm + st.bytes_sent_comm + st.bytes_received_comm;
    if (done || messages == 0) return;
    done = true;
    const std::vector<checkpoint::SnapshotOffers::ReadSlot> read = offers.read_slots();
    if (read.empty()) return;  // this rank moves no snapshot: nothing to rewrite
    const checkpoint::SnapshotOffers::ReadSlot& r = read.front();
    const std::string what = rewrite(r.segment, r.slot, commit);
    std::printf(
        "weft train: rank %d: snapshot slot %d of %s (step %lld) rewritten after the "
        "move's first message: %s (%s)\n",
        rank, r.slot, r.segment.c_str(), (long long)r.step, what.c_str(), kVariable);
    std::fflush(stdout);
  };
}

}  // namespace weft::launch
