// decide(): the quorum and rank-assignment rules of quorum.h.
#include "comm/elastic/quorum.h"

#include <set>
#include <vector>

#include "base/check.h"

namespace weft::comm {

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kStable:
      return "stable";
    case Verdict::kForm:
      return "form";
    case Verdict::kLastCall:
      return "last call";
    case Verdict::kTooFew:
      return "too few nodes";
    case Verdict::kQuorumLost:
      return "quorum lost";
  }
  return "?";
}

namespace {

// `base` plus an epoch: members keep their ranks, `joiners` fill the lowest free ranks in
// order, up to `max_nodes`; joiners that do not fit stay spares. The departed: the members
// that left handing over, and the departed of `current` still alive (their hand-over was not
// confirmed: the world it was to happen in may never have formed, so they hand over again).
MembershipRecord next_epoch(const MembershipRecord& current, const std::map<std::string, int>& keep,
                            const std::vector<std::string>& joiners, int max_nodes,
                            const std::set<std::string>& alive) {
  MembershipRecord next = current;
  next.epoch = current.epoch + 1;
  next.members = keep;
  next.departed.clear();
  for (const auto& [id, rank] : current.departed)
    if (alive.count(id)) next.departed[id] = rank;
  for (const auto& id : current.hands_over)
    if (auto it = current.members.find(id); it != current.members.end())
      next.departed[id] = it->second;
  for (const auto& [id, rank] : current.members)  // gone without handing its state over
    if (!keep.count(id) && !next.departed.count(id)) next.note_process_loss(id);
  next.left.clear();
  next.hands_over.clear();
  next.replaced.clear();
  next.spares.clear();
  std::set<int> used;
  for (const auto& [id, rank] : keep) used.insert(rank);
  int free_rank = 0;
  for (const auto& id : joiners) {
    if (int(next.members.size()) >= max_nodes) {
      next.spares.push_back(id);
      continue;
    }
    while (used.count(free_rank)) ++free_rank;
    next.members[id] = free_rank;
    used.insert(free_rank);
  }
  return next;
}

}  // namespace

Decision decide(const MembershipRecord& current, const std::set<std::string>& alive, int min_nodes,
                int max_nodes, bool last_call_passed) {
  WEFT_CHECK(min_nodes >= 1 && min_nodes <= max_nodes, "bad limits ", min_nodes, ":", max_nodes);
  Decision d;
  if (current.closed) {
    d.why = "the rendezvous is closed";
    return d;
  }
  // Alive spares that are not members, in arrival order.
  std::vector<std::string> spares;
  for (const auto& id : current.spares)
    if (alive.count(id) && !current.members.count(id)) spares.push_back(id);
  const int n_spares = int(spares.size());

  if (current.epoch == 0) {
    if (n_spares < min_nodes) {
      d.verdict = Verdict::kTooFew;
      d.why = str(n_spares, " of at least ", min_nodes, " nodes have joined");
      return d;
    }
    if (n_spares < max_nodes && !last_call_passed) {
      d.verdict = Verdict::kLastCall;
      d.why = str(n_spares, " nodes joined (min ", min_nodes, ", max ", max_nodes,
                  "): last call for more");
      return d;
    }
    d.verdict = Verdict::kForm;
    d.next = next_epoch(current, {}, spares, max_nodes, alive);
    d.why = str("epoch 1 forms with ", d.next.members.size(), " nodes");
    return d;
  }

  // B: members that did not leave; A: those of B alive.
  std::map<std::string, int> base, alive_members;
  for (const auto& [id, rank] : current.members) {
    if (current.has_left(id)) continue;
    base[id] = rank;
    if (alive.count(id)) alive_members[id] = rank;
  }
  const int n_base = int(base.size()), n_alive = int(alive_members.size());
  const int n_members = int(current.members.size());
  const std::string seen =
      str(n_alive, " of ", n_base, " members of epoch ", current.epoch, " alive");

  // A departing node gone before its hand-over was confirmed: its workers will never come to
  // the world that waits for them, so the epoch re-forms without it (its state then comes
  // from another holder, a snapshot or a checkpoint).
  std::vector<std::string> departed_gone;
  for (const auto& [id, rank] : current.departed)
    if (!alive.count(id)) departed_gone.push_back(id);
  if (n_alive == n_base && current.left.empty() && !departed_gone.empty() &&
      n_alive + n_spares >= min_nodes) {
    d.verdict = Verdict::kForm;
    d.next = next_epoch(current, alive_members, spares, max_nodes, alive);
    d.why = str(seen, "; departing node ", departed_gone.front(),
                departed_gone.size() > 1 ? " and others" : "",
                " gone before its hand-over was confirmed; epoch ", d.next.epoch, " has ",
                d.next.members.size(), " members");
    return d;
  }
  if (n_alive == n_base && current.left.empty()) {
    if (n_spares == 0 || n_members >= max_nodes) {
      d.why = str(seen, "; no change");
      return d;
    }
    if (n_members + n_spares < max_nodes && !last_call_passed) {
      d.verdict = Verdict::kLastCall;
      d.why = str(seen, "; ", n_spares, " waiting to join: last call for more");
      return d;
    }
    d.verdict = Verdict::kForm;
    d.next = next_epoch(current, alive_members, spares, max_nodes, alive);
    d.why = str(seen, "; epoch ", d.next.epoch, " admits ", d.next.members.size() - n_members,
                " waiting nodes");
    return d;
  }

  if (2 * n_alive <= n_base) {
    d.verdict = Verdict::kQuorumLost;
    d.why = str(seen, "; a new epoch needs a strict majority (", n_base / 2 + 1, ")");
    return d;
  }
  if (n_alive + n_spares < min_nodes) {
    d.verdict = Verdict::kTooFew;
    d.why = str(seen, " and ", n_spares, " waiting: fewer than min_nodes (", min_nodes, ")");
    return d;
  }
  d.verdict = Verdict::kForm;
  d.next = next_epoch(current, alive_members, spares, max_nodes, alive);
  d.why = str(seen, " (", current.left.size(), " left); epoch ", d.next.epoch, " has ",
              d.next.members.size(), " members");
  return d;
}

}  // namespace weft::comm
