// MoeBalance: the per-step expert counts, the frozen global shares and the loss-free bias.
#include "core/graph/moe_balance.h"

#include <algorithm>

#include "base/check.h"

namespace weft::core {

MoeBalance::MoeBalance(Mode mode, std::vector<int> layers, int64_t experts, double rate)
    : mode_(mode), layers_(std::move(layers)), experts_(experts), rate_(rate) {
  WEFT_CHECK(experts_ >= 1, "MoeBalance needs experts, got ", experts_);
  const size_t L = layers_.size(), E = size_t(experts_);
  counts_.assign(L * E, 0.0);
  prob_sums_.assign(L * E, 0.0);
  tokens_.assign(L, 0.0);
  if (mode_ == Mode::kLossFree)
    for (size_t i = 0; i < L; ++i) bias_.push_back(Tensor::zeros({experts_}, DType::kF32));
}

std::unique_ptr<MoeBalance> MoeBalance::for_model(const ModelSpec& m) {
  if (m.arch != "moe-gpt" || m.moe.balance == "aux_loss") return nullptr;
  std::vector<int> layers;
  for (int64_t i = 0; i < m.layers; ++i)
    if (m.is_moe_layer(i)) layers.push_back(int(i));
  Mode mode = m.moe.balance == "loss_free" ? Mode::kLossFree : Mode::kGlobalAux;
  return std::make_unique<MoeBalance>(mode, std::move(layers), m.moe.experts,
                                      m.moe.bias_update_rate);
}

size_t MoeBalance::slot(int layer) const {
  auto it = std::find(layers_.begin(), layers_.end(), layer);
  WEFT_CHECK(it != layers_.end(), "block ", layer, " has no MoE layer");
  return size_t(it - layers_.begin());
}

void MoeBalance::begin_step() {
  std::fill(counts_.begin(), counts_.end(), 0.0);
  std::fill(prob_sums_.begin(), prob_sums_.end(), 0.0);
  std::fill(tokens_.begin(), tokens_.end(), 0.0);
  shares_.clear();
  frozen_ = false;
}

void MoeBalance::record(int layer, const double* counts, const double* prob_sums, double tokens) {
  WEFT_CHECK(!frozen_, "MoE routing of block ", layer,
             " recorded after the step's shares were frozen (a forward after a backward?)");
  const size_t s = slot(layer), E = size_t(experts_);
  for (size_t e = 0; e < E; ++e) {
    counts_[s * E + e] += counts[e];
    prob_sums_[s * E + e] += prob_sums[e];
  }
  tokens_[s] += tokens;
}

std::vector<double> MoeBalance::pack() const {
  std::vector<double> v(counts_);
  v.insert(v.end(), prob_sums_.begin(), prob_sums_.end());
  v.insert(v.end(), tokens_.begin(), tokens_.end());
  return v;
}

void MoeBalance::absorb(const std::vector<double>& summed) {
  const size_t n = counts_.size();
  WEFT_CHECK(summed.size() == 2 * n + tokens_.size(), "MoE balance table of ", summed.size(),
             " numbers, expected ", 2 * n + tokens_.size());
  std::copy(summed.begin(), summed.begin() + long(n), counts_.begin());
  std::copy(summed.begin() + long(n), summed.begin() + long(2 * n), prob_sums_.begin());
  std::copy(summed.begin() + long(2 * n), summed.end(), tokens_.begin());
}

void MoeBalance::freeze_shares() {
  const size_t E = size_t(experts_);
  shares_.assign(counts_.size(), 0.0);
  for (size_t s = 0; s < layers_.size(); ++s) {
    double total = 0;
    for (size_t e = 0; e < E; ++e) total += counts_[s * E + e];
    WEFT_CHECK(total > 0, "MoE block ", layers_[s], " routed no token this step");
    for (size_t e = 0; e < E; ++e) shares_[s * E + e] = counts_[s * E + e] / total;
  }
  frozen_ = true;
}

const double* MoeBalance::shares(int layer) const {
  return frozen_ ? shares_.data() + slot(layer) * size_t(experts_) : nullptr;
}

double MoeBalance::global_aux_loss() const {
  WEFT_CHECK(frozen_, "global_aux_loss before freeze_shares");
  const size_t E = size_t(experts_);
  double aux = 0;
  for (size_t s = 0; s < layers_.size(); ++s) {
    double fp = 0;
    for (size_t e = 0; e < E; ++e) fp += shares_[s * E + e] * prob_sums_[s * E + e] / tokens_[s];
    aux += double(experts_) * fp;
  }
  return aux;
}

const float* MoeBalance::bias(int layer) const {
  return mode_ == Mode::kLossFree ? bias_[slot(layer)].data<float>() : nullptr;
}

void MoeBalance::copy_bias_from(const MoeBalance& other) {
  WEFT_CHECK(mode_ == Mode::kLossFree && other.mode_ == Mode::kLossFree && layers_ == other.layers_ &&
                 experts_ == other.experts_,
             "copy_bias_from: the two balancings differ");
  for (size_t s = 0; s < layers_.size(); ++s) bias_[s].copy_from(other.bias_[s]);
}

Tensor& MoeBalance::bias_tensor(int layer) {
  WEFT_CHECK(mode_ == Mode::kLossFree, "only loss_free balancing has a routing bias");
  return bias_[slot(layer)];
}

void MoeBalance::update_bias() {
  WEFT_CHECK(mode_ == Mode::kLossFree, "update_bias outside loss_free balancing");
  const size_t E = size_t(experts_);
  for (size_t s = 0; s < layers_.size(); ++s) {
    double total = 0;
    for (size_t e = 0; e < E; ++e) total += counts_[s * E + e];
    float* b = bias_[s].data<float>();
    for (size_t e = 0; e < E; ++e) {
      // load vs mean as load * E vs total: integers, so exact on every layout. An
      // underloaded expert's bias rises, an overloaded one's falls, a balanced one stays.
      const double load = counts_[s * E + e] * double(E);
      const double dir = load < total ? 1.0 : load > total ? -1.0 : 0.0;
      b[e] = float(double(b[e]) + rate_ * dir);
    }
  }
}

MoeRoutingInputs moe_routing_inputs(const MoeBalance* b, int layer, bool backward) {
  MoeRoutingInputs r;
  if (!b) return r;
  r.bias = b->bias(layer);
  r.balance_loss = b->mode() != MoeBalance::Mode::kLossFree;
  if (backward && b->mode() == MoeBalance::Mode::kGlobalAux) {
    r.shares = b->shares(layer);
    WEFT_CHECK(r.shares, "aux_loss_global: the backward of MoE block ", layer,
               " ran before the step's expert shares were reduced (every forward must come first)");
  }
  return r;
}

}  // namespace weft::core
