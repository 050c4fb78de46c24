// Names of the allocator seam's enums, shared by trace files, logs and benchmarks.
#include "memory/allocator.h"

namespace weft::memory {

const char* tag_name(Tag t) {
  switch (t) {
    case Tag::kActivation:
      return "activation";
    case Tag::kParameter:
      return "parameter";
    case Tag::kGradient:
      return "gradient";
    case Tag::kOptimizer:
      return "optimizer";
    case Tag::kWorkspace:
      return "workspace";
    case Tag::kComm:
      return "comm";
    case Tag::kOther:
      return "other";
  }
  return "?";
}

bool parse_tag(const std::string& name, Tag* out) {
  for (Tag t : {Tag::kActivation, Tag::kParameter, Tag::kGradient, Tag::kOptimizer, Tag::kWorkspace,
                Tag::kComm, Tag::kOther}) {
    if (name == tag_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kOther:
      return "other";
  }
  return "?";
}

bool parse_phase(const std::string& name, Phase* out) {
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer, Phase::kOther}) {
    if (name == phase_name(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

}  // namespace weft::memory
