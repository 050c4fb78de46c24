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
  // family, in family order, so every rank issues the same sequence. Within a group the
  // communicator's ranks follow the group's member order, which is also the order of the
  // chunks its collectives exchange. `world` must outlive this object only during the call.
  // Throws the split's CommError/TimeoutError when a peer is missing.
  ProcessGroups(comm::Communicator& world, const planner::Plan& plan);

  // The communicator of process group `id`; InternalError when this rank is not a member.
  comm::Communicator& group(int id) const;
  bool member(int id) const { return groups_.count(id) > 0; }
  size_t count() const { return groups_.size(); }
  // Aborts every sub-communicator (a peer failed): pending operations fail at once.
  void abort_all(const std::string& reason) noexcept;

 private:
  std::map<int, std::unique_ptr<comm::Communicator>> groups_;
};

}  // namespace weft::parallel
