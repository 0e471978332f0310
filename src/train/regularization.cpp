// StyleGAN2's separate regularization updates (objective.h, set_separate_regularization):
// D reg (R1 alone on the step's real images) and G reg (path length), each an optimizer
// update of its own, as in Karras et al. 2020 (arXiv:1912.04958, Sec. 3.1-3.2, Appendix B)
// and the authors' StyleGAN2-ADA training loop (phases Dreg and Greg).
#include <algorithm>
#include <cmath>
#include <string>
#include <stdexcept>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/objective.h"
#include "shardgan/util/test_control.h"
#include "train/r1_penalty.h"

namespace shardgan {

R1Forward r1_forward(ShardedModel& d, const TensorList& real, at::ScalarType md, double gamma,
                     const std::function<at::Tensor(const at::Tensor&)>& augment) {
  at::Tensor x = real.at(0).detach().requires_grad_(true);
  R1Forward r;
  r.out = d.forward(TensorList{augment ? augment(x) : x, real.at(1)});
  r.logits = r.out.at(0).reshape({-1}).to(md);
  const at::Tensor gx =
      torch::autograd::grad({r.logits.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  r.penalty = gx.pow(2).flatten(1).sum(1).mean() * (0.5 * gamma);
  return r;
}

void GanObjective::d_reg(TrainedModel d, const StepInputs& in, StepStats& st) {
  const int64_t k = micro_;
  if (static_cast<int64_t>(reg_reals_.size()) != k) {
    throw std::logic_error("GanObjective::d_reg: the step's D update kept " + std::to_string(reg_reals_.size()) +
                           " real micro-batches, not " + std::to_string(k));
  }
  // The lazy factor: the penalty of one step in r1_every stands for all of them. Negative
  // control (stylegan2_parity): the control drops it.
  const double gain = test_control("r1_without_lazy_gain") ? 1.0 : static_cast<double>(r1_every_);
  bool loss_finite = true;
  at::Tensor penalties = torch::zeros({1}, torch::kDouble);
  for (int64_t j = 0; j < k; ++j) {
    const TensorList& real = reg_reals_[static_cast<size_t>(j)];
    const at::ScalarType md = real.at(0).scalar_type();
    d.model->set_gradient_sync(j == k - 1);
    // D stays gathered whole (and its units are not checkpointed) from the forward to the
    // penalty's backward, which differentiates D's input gradient again.
    d.model->begin_higher_order();
    const auto [out, logits, penalty] = r1_forward(*d.model, real, md, r1_gamma_, augment_for(in, j, AugmentSite::kDReg, 0));
    // logits * 0 keeps every D parameter in the backward (the penalty does not depend on
    // the output layer's bias), as the authors' real_logits * 0: each unit's gradient is
    // then defined, and zero where the penalty does not reach.
    d.scaler->scale_loss((penalty * gain + logits.mean() * 0.0) / static_cast<double>(k)).backward();
    d.model->end_higher_order();
    const at::Tensor v = host(at::stack({penalty.detach(), logits.detach().sign().sum().to(penalty.scalar_type())}));
    loss_finite = loss_finite && std::isfinite(v[0].item<double>());
    penalties += v[0].reshape({1});
    st.real_signs += v[1].item<double>();  // ADA's r_t counts D reg's real passes too, as the authors'
    st.real_logits += static_cast<double>(logits.numel());
  }
  reg_reals_.clear();
  update_comm().all_reduce(penalties, ReduceOp::kAvg);  // the step's figure: the global batch's mean
  st.r1 += penalties.item<double>() / static_cast<double>(k);
  double norm = 0;
  bool nonfinite = false;
  if (before_update_) before_update_();
  if (!finish_update(d, norm, 0, loss_finite, nonfinite)) st.skipped_d = true;
  st.nonfinite_d = st.nonfinite_d || nonfinite;
  st.grad_norm_d = std::max(st.grad_norm_d, norm);
}

void GanObjective::g_reg(TrainedModel g, const StepInputs& in, StepStats& st) {
  const int64_t k = micro_;
  if (!in.normal) throw std::logic_error("GanObjective::g_reg: StepInputs::normal is not set");
  // Fresh latents, as each of the authors' phases draws its own; the first
  // global_batch / batch_shrink of them (the same rows on every rank).
  const TensorList lat = in.latents();
  const int64_t n = lat[0].size(0) / pl_.batch_shrink;
  if (n < k || n % k != 0) {
    throw std::invalid_argument("train.pl_batch_shrink: the path-length batch (" + std::to_string(n) +
                                ") must split into train.micro_batches (" + std::to_string(k) + ") equal parts");
  }
  const at::Tensor z = lat[0].narrow(0, 0, n);
  const at::Tensor y = lat[1].defined() ? lat[1].narrow(0, 0, n) : at::Tensor();
  Communicator& comm = update_comm();
  // Negative control (stylegan2_parity): each rank keeps its own running mean from its own
  // samples, as the authors' code does per process.
  const bool local_mean = test_control("pl_mean_per_rank");
  at::Tensor noise;  // the whole path-length batch's, drawn once the image shape is known
  bool loss_finite = true;
  double penalty_sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    g.model->set_gradient_sync(j == k - 1);
    g.model->begin_higher_order();
    const TensorList out = g.model->forward(TensorList{in.local(z, j), y.defined() ? in.local(y, j) : y});
    if (out.size() < 2 || !out[1].defined()) {
      throw std::invalid_argument("train.pl_weight: G's forward returned no styles (ModelFamily::generator_returns_styles)");
    }
    const at::Tensor& img = out[0];
    const at::Tensor& ws = out[1];
    if (!noise.defined()) {
      noise = in.normal({n, img.size(1), img.size(2), img.size(3)}, z.scalar_type());
    }
    // The running mean in float32, or float64 when the run is (its parity is the point).
    const at::ScalarType md = z.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor u = in.local(noise, j).to(img.device(), img.scalar_type()) /
                         std::sqrt(static_cast<double>(img.size(2) * img.size(3)));
    at::Tensor gw = torch::autograd::grad({(img * u).sum()}, {ws}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    at::Tensor lengths = gw.to(md).square().sum(2).mean(1).sqrt();  // [b]
    // The micro-batch's mean over every rank's samples (equal shares), or this rank's alone.
    at::Tensor mean = lengths.detach().mean().to(at::kCPU, at::kDouble).reshape({1});
    if (!local_mean) comm.all_reduce(mean, ReduceOp::kAvg);
    at::Tensor m = torch::full({}, pl_mean_, torch::TensorOptions().dtype(md));
    m = m + (mean.reshape({}).to(md) - m) * pl_.decay;
    pl_mean_ = m.item<double>();
    at::Tensor penalty = (lengths - m.to(lengths.device())).square().mean();
    // img * 0 keeps every G parameter in the backward (the last toRGB's bias does not
    // reach the styles' gradient), as the authors' gen_img[:, 0, 0, 0] * 0.
    at::Tensor loss = (penalty * (pl_.weight * static_cast<double>(pl_.every)) + img.sum().to(md) * 0.0) /
                      static_cast<double>(k);
    g.scaler->scale_loss(loss).backward();
    g.model->end_higher_order();
    const double p = host(penalty.detach()).item<double>();
    loss_finite = loss_finite && std::isfinite(p);
    penalty_sum += p;
  }
  st.pl = penalty_sum / static_cast<double>(k);
  st.pl_mean = pl_mean_;
  double norm = 0;
  bool nonfinite = false;
  if (before_update_) before_update_();
  if (!finish_update(g, norm, 0, loss_finite, nonfinite)) st.skipped_g = true;
  st.nonfinite_g = st.nonfinite_g || nonfinite;
  st.grad_norm_g = std::max(st.grad_norm_g, norm);
}

}  // namespace shardgan
