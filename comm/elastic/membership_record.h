// The one compare-and-set record per elastic job (key rdzv/<run id>/state): the current
// membership epoch, who is in it at which node rank, who waits, and whether the job is over.
// Also its text encoding, which is what the store holds and what a person debugging reads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace weft::comm {

// Every agent reads it, computes a successor, and writes it with compare_set(old, new);
// a conflict means another agent wrote first, so it re-reads and recomputes (rendezvous.h).
struct MembershipRecord {
  // Incremented by every write. With `writer` it makes each written value unique, so that
  // compare_set's "returns desired when it wrote" cannot be fooled by an equal old value.
  int64_t version = 0;
  std::string writer;  // node id of the agent that wrote this value
  // 0: no membership has formed yet (nodes gather in `spares`). Epoch E >= 1 is written
  // exactly once, by the compare_set that formed it, and changes only with the membership.
  int64_t epoch = 0;
  // node id -> node rank for `epoch`. Ranks are stable slots in [0, max_nodes): survivors
  // keep theirs across epochs, newcomers take the lowest free one; they may have gaps.
  std::map<std::string, int> members;
  // Nodes waiting for admission, in arrival order: before epoch 1 every joiner, after it
  // the nodes beyond max_nodes (hot spares) and joiners not yet admitted.
  std::vector<std::string> spares;
  // Members of `epoch` that left gracefully (Rendezvous::leave): gone without waiting for
  // their heartbeat to expire, and not counted against the quorum. Cleared by a new epoch.
  std::vector<std::string> left;
  // Those of `left` whose live workers hand their state over in the next epoch (a
  // graceful leave of a live job), as opposed to a node whose workers failed.
  std::vector<std::string> hands_over;
  // The members of an earlier epoch that left it handing their state over (hands_over),
  // with their node rank there: set by the epoch that follows, and carried into every later
  // epoch until the node confirms its hand-over (Rendezvous::confirm_handover removes it
  // from the current epoch's record) or is gone (its alive key, kept while it departs,
  // expired). Live workers of a departing node hand their state over in the epoch's first
  // world before they go (docs/run.md); a leave during that move forms an epoch that still
  // lists them, and they hand over there.
  std::map<std::string, int> departed;
  // Workers replaced in place in this epoch (Rendezvous::renew): (local rank, node id) of
  // each worker that died on a member whose agent started another in its slot. The epoch
  // has the previous one's members; a live job's workers abort collectives of the old world
  // at once (a process they wait on is gone). Set by a renewal, cleared by the next epoch.
  std::vector<std::pair<int, std::string>> replaced;
  // (epoch F, node id) of each node whose process of epoch F-1's world died, noted by the
  // epoch F that followed: a member of F-1 that F dropped without its state handed over
  // (lost, or left after its workers failed), and a member with a worker replaced in place
  // by F. Kept for the latest kProcessLossEpochs epochs, so that an agent that missed
  // epochs (several formed within one of its polls) can still tell whether its workers'
  // world lost a process since (Rendezvous lost_a_process).
  std::vector<std::pair<int64_t, std::string>> process_losses;
  // The job's restart round (Rendezvous::ask_round): 0 until an agent whose workers failed
  // asks for the next, which every node's workers then restart in. It lives in the record, not
  // in a key of its own, so that the round and the departing nodes its world counts are one
  // value: every agent reads both at once, and a hand-over confirmed against an older round is
  // refused by the same compare-and-set (Rendezvous::confirm_handover). Never reset: new epochs
  // carry it (restart counts are (epoch - 1) + round on every node).
  int64_t round = 0;
  bool closed = false;       // the job finished or failed: nobody may join any more
  std::string close_reason;  // one line, why it closed

  // The node's rank when it is a member that has not left; nullopt otherwise.
  std::optional<int> rank_of(const std::string& node_id) const;
  bool is_spare(const std::string& node_id) const;
  bool has_left(const std::string& node_id) const;
  // Notes that `node_id`'s processes of the previous epoch's world died (this record is the
  // epoch that follows) and forgets notes older than kProcessLossEpochs epochs.
  void note_process_loss(const std::string& node_id);
};

// How many epochs MembershipRecord::process_losses covers: an agent whose workers are more
// epochs behind than this cannot tell what their world lost, and assumes the worst.
constexpr int64_t kProcessLossEpochs = 64;

// Text encoding, one field per line, '\n' after each:
//
//   weft-rdzv 1                  format tag and version (decode refuses others)
//   version <int64>
//   writer <node id>
//   epoch <int64>
//   member <rank> <node id>      one per member, by rank
//   spare <node id>              one per spare, in arrival order
//   left <node id>               one per member that left
//   hands_over <node id>         one per member that left and hands its state over
//   departed <rank> <node id>    one per departing node whose hand-over is not confirmed
//   replaced <local> <node id>   one per worker replaced in place by this epoch (renew)
//   process_lost <epoch> <node id>  one per note of process_losses, oldest first
//   round <int64>                only once a restart round was asked (absent: round 0)
//   closed <reason>              only when closed; the reason runs to the end of the line
//
// Node ids contain no whitespace or control characters (check_node_id), so a line splits
// on its spaces. Kept as text on purpose: `weft store` dumps and logs show it as it is.
std::string encode(const MembershipRecord& record);
// Inverse of encode. Throws CommError naming `key` and the offending line when the text is
// not a record (a store shared with something else, or a corrupt value).
MembershipRecord decode(const std::string& text, const std::string& key);

// Throws ConfigError(field, ...) unless `id` is 1..256 printable characters without
// whitespace or '/'. Node ids appear in store keys (rdzv/<run>/alive/<node id>) and records.
void check_node_id(const std::string& id, const std::string& field);

}  // namespace weft::comm
