// Expert balancing over the whole global batch (model.moe.balance), the state a step's MoE
// routings share beyond their own micro-batch:
//
//   aux_loss_global  the Switch balance loss E sum_e f_e P_e with f_e, the share of the
//                    top-k assignments that went to expert e, counted over every micro-batch
//                    of every data-parallel rank (not per micro-batch). f_e has no gradient,
//                    so the loss's gradient needs f_e of the whole step before the first
//                    backward: trainers run every forward first (planner: gpipe order) or a
//                    routing pre-pass, then reduce() and freeze the shares.
//   loss_free        no balance loss; a per-expert bias added to the routing probabilities
//                    for the top-k choice only (the weights stay the probabilities), moved
//                    after every step by rate * sign(mean load - load_e) from the step's
//                    global load (DeepSeek-V3's auxiliary-loss-free balancing). The bias is
//                    training state: checkpoints carry it (parallel/vps.h, kBuffer).
//
// Counts are integers held in doubles, so their sum over ranks is exact and the shares are
// the same numbers whichever layout counted them. A routing replicated on several ranks
// (tensor-parallel lanes) is counted once per replica; every token of a layer is replicated
// alike, so shares and the sign of (mean - load) do not change.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/job_spec.h"
#include "core/tensor.h"

namespace weft::core {

class MoeBalance {
 public:
  enum class Mode { kGlobalAux, kLossFree };

  // `layers`: the transformer blocks with an MoE layer, in order; `rate`: loss_free's bias
  // step. The biases start at zero.
  MoeBalance(Mode mode, std::vector<int> layers, int64_t experts, double rate);
  // From model.moe.balance; nullptr for plain aux_loss (nothing to share across a step).
  static std::unique_ptr<MoeBalance> for_model(const ModelSpec& m);

  Mode mode() const { return mode_; }
  int64_t experts() const { return experts_; }
  const std::vector<int>& layers() const { return layers_; }

  // Start of a step: zero the counts, forget the shares.
  void begin_step();
  // A routing of `tokens` tokens in block `layer` chose experts with these pre-capacity
  // assignment counts and probability sums (E each).
  void record(int layer, const double* counts, const double* prob_sums, double tokens);

  // The step's counts, probability sums and token counts as one vector (layers x (2E + 1)),
  // to sum over ranks; absorb() takes the sum back.
  std::vector<double> pack() const;
  void absorb(const std::vector<double>& summed);

  // aux_loss_global: fixes f_e from the (reduced) counts; shares() is valid until the next
  // begin_step(). The reported balance loss sum over layers of E sum_e f_e P_e uses the
  // step's mean probabilities.
  void freeze_shares();
  const double* shares(int layer) const;  // nullptr before freeze_shares()
  double global_aux_loss() const;

  // loss_free: the routing bias of a block (f32, E; nullptr in the other mode) and its
  // update from the (reduced) counts of the step.
  const float* bias(int layer) const;
  void update_bias();
  // Takes another run's biases (same layers and experts): an evaluator built from gathered
  // weights routes like the trainer.
  void copy_bias_from(const MoeBalance& other);
  // The bias tensors by block, for checkpoints: "moe.bias:h.<layer>".
  Tensor& bias_tensor(int layer);
  static std::string bias_name(int layer) { return "moe.bias:h." + std::to_string(layer); }

 private:
  size_t slot(int layer) const;

  Mode mode_;
  std::vector<int> layers_;
  int64_t experts_;
  double rate_;
  std::vector<double> counts_, prob_sums_, tokens_;  // per slot (x E for the first two)
  std::vector<double> shares_;                       // per slot x E once frozen
  bool frozen_ = false;
  std::vector<Tensor> bias_;                         // per slot, (E) f32
};

// What one routing of block `layer` reads from `b` (null: plain aux_loss, nothing).
struct MoeRoutingInputs {
  const float* bias = nullptr;     // loss_free: the top-k choice's bias
  const double* shares = nullptr;  // aux_loss_global backward: the frozen global f_e
  bool balance_loss = true;        // false under loss_free: no balance loss, no gradient
};
MoeRoutingInputs moe_routing_inputs(const MoeBalance* b, int layer, bool backward);

}  // namespace weft::core
