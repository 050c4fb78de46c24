// The device mesh at run time: the world communicator and one sub-communicator per process
// group of the plan that this rank belongs to (size-1 groups included, so every axis exists
// even at degree 1).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "planner/plan.h"

namespace weft::parallel {

class ProcessGroups {
 public:
  // Collective over `world` (every rank calls it with the same plan): one split() per group
  // family that needs one, in family order, so every rank issues the same sequence. Within a
  // group the communicator's ranks follow the group's member order, which is also the order
  // of the chunks its collectives exchange. Throws the split's CommError/TimeoutError when a
  // peer is missing.
  //
  // Two kinds of family need no split (decided from the plan alone, so alike on every rank;
  // each split costs an exchange over the world and, for a group of several ranks, a new
  // connection mesh, 15-70 ms of a resize on loopback):
  //   - every group of the family has one rank: a loopback communicator (not on NCCL, whose
  //     tensors live on the GPU);
  //   - the family's one group is the whole world in rank order, and every rank runs the
  //     same program (the plan has one role: data parallelism alone): `world` itself serves
  //     it. Its collectives and the world's then share one queue; that is safe because every
  //     rank issues both in the same order (the same program), which ranks of different
  //     roles need not (a pipeline stage without backward work exchanges MoE shares later).
  // `world` must outlive this object.
  ProcessGroups(comm::Communicator& world, const planner::Plan& plan);

  // Whether these groups serve `plan` over `world`: built over that very communicator, for a
  // plan with the same groups (ids, families, members in order) and the same number of
  // programs (which decides whether `world` may serve a group). Groups built ahead, with
  // the next world's communicator, are refused by a trainer whose plan they do not fit.
  bool fits(const comm::Communicator& world, const planner::Plan& plan) const;

  // The communicator of process group `id`; InternalError when this rank is not a member.
  comm::Communicator& group(int id) const;
  bool member(int id) const { return groups_.count(id) > 0; }
  size_t count() const { return groups_.size(); }
  // How many groups of this rank are served by `world` itself, and how many split() calls
  // the constructor made (for tests and the resize's debug line).
  int world_groups() const { return world_groups_; }
  int splits() const { return splits_; }
  // Aborts every communicator of this rank's groups (a peer failed): pending operations
  // fail at once. That includes `world` when it serves a group.
  void abort_all(const std::string& reason) noexcept;
  // The communicators of this rank's groups, each once (`world` too when it serves one): what
  // a lost member must abort besides the world, since aborting a communicator does not reach
  // the ones split from it.
  std::vector<comm::Communicator*> communicators() const;

 private:
  const comm::Communicator* world_ = nullptr;
  std::vector<planner::ProcessGroup> built_for_;  // the plan's groups, for fits()
  size_t programs_ = 0;                           // the plan's roles
  std::map<int, comm::Communicator*> groups_;
  std::vector<std::unique_ptr<comm::Communicator>> owned_;
  int world_groups_ = 0, splits_ = 0;
};

}  // namespace weft::parallel
