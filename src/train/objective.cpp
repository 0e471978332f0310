#include "shardgan/train/objective.h"

#include <cmath>
#include <stdexcept>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/nn/power_iteration.h"
#include "shardgan/optim/clip_grad.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/optimizer.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/step_executor.h"
#include "shardgan/util/test_control.h"
#include "train/r1_penalty.h"

namespace shardgan {
namespace F = torch::nn::functional;

GanObjective::GanObjective(std::string loss, int64_t d_steps, int64_t micro_batches,
                           double grad_clip, Communicator& comm, double r1_gamma, int64_t r1_every)
    : loss_(std::move(loss)), d_steps_(d_steps), micro_(micro_batches), grad_clip_(grad_clip),
      r1_gamma_(r1_gamma), r1_every_(r1_every), comm_(comm) {
  if (!(r1_gamma_ >= 0) || r1_every_ < 1) throw std::invalid_argument("r1_gamma must be >= 0 and r1_every >= 1");
  if (loss_ != "nonsaturating" && loss_ != "hinge" && loss_ != "least_squares") {
    throw std::invalid_argument("GAN loss '" + loss_ + "' is unknown: use nonsaturating, hinge or least_squares");
  }
  if (d_steps_ < 1 || micro_ < 1) throw std::invalid_argument("d_steps and micro_batches must be >= 1");
}

GanObjective::~GanObjective() = default;

at::Tensor GanObjective::host(const at::Tensor& t) { return t.to(at::kCPU, at::kDouble); }

GanObjective::Augment GanObjective::augment_for(const StepInputs& in, int64_t j, AugmentSite site,
                                                int64_t d_step) const {
  if (!aug_ || aug_->p() <= 0) return {};  // p 0: every transform is the identity
  const auto [u, z] = aug_->draws(in.step, site, d_step);
  at::Tensor ul = in.local(u, j), zl = in.local(z, j);  // this rank's images of micro-batch j
  if (test_control("ada_draws_unsliced")) {  // negative control (ctest ada_control_np2): not this rank's rows
    ul = u.narrow(0, 0, ul.size(0)).contiguous();
    zl = z.narrow(0, 0, zl.size(0)).contiguous();
  }
  const AdaptiveAugment* a = aug_;
  return [a, ul, zl, site](const at::Tensor& x) {
    if (x.size(0) != ul.size(0)) {
      throw std::logic_error("GanObjective: " + std::to_string(x.size(0)) + " images for " +
                             std::to_string(ul.size(0)) + " augmentation draws");
    }
    return a->apply(x, ul, zl, site);
  };
}

void GanObjective::set_paired(bool on, double l1_weight, double adversarial_weight) {
  if (on && aux_class_weight_ > 0) throw std::invalid_argument("the auxiliary class loss does not take paired data");
  if (on && simultaneous_) throw std::invalid_argument("the simultaneous update does not take paired data");
  paired_ = on;
  l1_weight_ = l1_weight;
  adversarial_weight_ = adversarial_weight;
}

void GanObjective::set_aux_class_weight(double w) {
  if (!(w >= 0) || !std::isfinite(w)) throw std::invalid_argument("aux_class_weight must be a finite value >= 0");
  if (w > 0 && paired_) throw std::invalid_argument("the auxiliary class loss does not take paired data");
  aux_class_weight_ = w;
}

at::Tensor GanObjective::class_loss(const TensorList& d_out, const at::Tensor& y, at::ScalarType md, int64_t start,
                                    int64_t n) const {
  if (aux_class_weight_ == 0) return {};
  if (d_out.size() < 2 || !d_out[1].defined()) {
    throw std::invalid_argument("train.aux_class_weight needs a D that returns class logits (model.d_class_head: true)");
  }
  if (!y.defined()) throw std::invalid_argument("train.aux_class_weight needs class labels (a conditional model)");
  const at::Tensor c = n < 0 ? d_out[1] : d_out[1].narrow(0, start, n);
  return F::cross_entropy(c.to(md), y.to(c.device()));
}

namespace {
// A class term for the host stats: the detached value, or 0 when the term is off.
at::Tensor or_zero(const at::Tensor& ce, const at::Tensor& like) {
  return ce.defined() ? ce.detach().to(like.device(), like.scalar_type()) : torch::zeros({}, like.options());
}
}  // namespace

at::Tensor GanObjective::d_loss_real(const at::Tensor& real) const {
  if (loss_ == "least_squares") return (real - 1.0).pow(2).mean();
  return loss_ == "hinge" ? torch::relu(1.0 - real).mean() : F::softplus(-real).mean();
}

at::Tensor GanObjective::d_loss_fake(const at::Tensor& fake) const {
  if (loss_ == "least_squares") return fake.pow(2).mean();
  return loss_ == "hinge" ? torch::relu(1.0 + fake).mean() : F::softplus(fake).mean();
}

at::Tensor GanObjective::g_loss(const at::Tensor& fake_logits) const {
  at::Tensor fake = fake_logits;
  // Fault injection for the non-finite G loss test (split_placement): one logit of G's
  // loss is +inf, which leaves the hinge loss's gradient finite.
  if (test_control("g_loss_inf_logit")) fake = fake.index_put({torch::zeros({1}, torch::kLong)},
                                                              torch::full({1}, INFINITY, fake.options()));
  if (loss_ == "hinge") return -fake.mean();
  if (loss_ == "least_squares") return (fake - 1.0).pow(2).mean();
  return F::softplus(-fake).mean();
}

StepMetrics GanObjective::step(TrainedModel g, TrainedModel d, const StepInputs& in) {
  return SharedStepExecutor(*this).step(g, d, in);
}

void GanObjective::d_update(TrainedModel g, TrainedModel d, const StepInputs& in, int64_t s,
                            const std::vector<MicroFakes>* given, StepStats& st) {
  const int64_t k = micro_;
  // Each loss is divided by k so that the accumulated gradient equals the one of the whole
  // global batch. G runs without autograd, so G gets no gradients.
  bool loss_finite = true;
  TensorList fake_in = given ? TensorList{} : in.latents();
  if (paired_) paired_batch_.clear();
  // D reg after the step's D updates reads the last one's real micro-batches.
  const bool keep_reals = s == d_steps_ - 1 && r1_update_due(in.step);
  reg_reals_.clear();
  for (int64_t j = 0; j < k; ++j) {
    TensorList real = in.real(j);
    if (keep_reals) reg_reals_.push_back(real);
    at::Tensor y_fake, fake;
    if (given) {
      fake = given->at(j).images;
      y_fake = given->at(j).labels;
      if (paired_) {  // split placement, D's side: G's ranks translated this slice's A
        y_fake = real.at(1);
        paired_batch_.push_back({at::Tensor(), y_fake, real.at(0)});
      }
    } else if (paired_) {  // G translates this micro-batch's A; G's pass reuses the pairs
      const at::Tensor z = in.local(fake_in[0], j);
      y_fake = real.at(1);
      paired_batch_.push_back({z, y_fake, real.at(0)});
      torch::NoGradGuard no_grad;
      fake = g.model->forward(TensorList{z, y_fake}).at(0);
    } else {
      y_fake = fake_in[1].defined() ? in.local(fake_in[1], j) : at::Tensor();
      torch::NoGradGuard no_grad;
      fake = g.model->forward(TensorList{in.local(fake_in[0], j), y_fake}).at(0);
    }
    // Real and fake each get their own forward and backward, unless they share one joint
    // pass (d_joint_pass). One backward through two D forwards would keep every D unit
    // gathered until the backward of the first forward reaches it (the engine runs the
    // later forward's path first, and a unit's parameter gradients are complete only after
    // both); two backwards release each unit as soon as it is done, at the cost of one
    // more reduce-scatter of D per D step (stages 2-3). The joint pass has neither cost.
    const at::ScalarType md = real.at(0).scalar_type();
    const bool r1_due = r1_folded_due(d);
    at::Tensor d_real, d_fake, loss_real, loss_fake, class_ce;
    if (d_joint_pass_ && !r1_due) {
      d.model->set_gradient_sync(j == k - 1);
      auto [rp, fake_logits] = d_joint_pass(d, real, fake, y_fake, md);
      d_real = rp.logits;
      d_fake = fake_logits;
      class_ce = rp.class_ce;
      loss_real = d_loss_real(d_real) / k;
      loss_fake = d_loss_fake(d_fake) / k;
    } else {
      d.model->set_gradient_sync(false);
      RealPass rp = d_real_pass(d, real, md, augment_for(in, j, AugmentSite::kDReal, s));
      d_real = rp.logits;
      class_ce = rp.class_ce;
      loss_real = d_loss_real(d_real) / k;
      st.r1 += rp.r1 / d_steps_;
      d.model->set_gradient_sync(j == k - 1);
      {
        // BigGAN-PyTorch's D sees real and fake in one forward, so spectral norm advances
        // u once per D forward of a D step: the real pass did it.
        PowerIterationPause once;
        const at::Tensor x = augmented(augment_for(in, j, AugmentSite::kDFake, s), fake);
        d_fake = d.model->forward(TensorList{x, y_fake}).at(0).reshape({-1}).to(md);
      }
      loss_fake = d_loss_fake(d_fake) / k;
      d.scaler->scale_loss(loss_fake).backward();
    }
    // loss_d, D(x), D(G(z)) of this micro-batch, copied to the host together (one copy
    // and one wait on a GPU).
    const at::Tensor v = host(at::stack({loss_real.detach() + loss_fake.detach(),
                                         torch::sigmoid(d_real.detach()).mean(),
                                         torch::sigmoid(d_fake.detach()).mean(), or_zero(class_ce, loss_real),
                                         d_real.detach().sign().sum().to(loss_real.scalar_type())}));
    loss_finite = loss_finite && std::isfinite(v[0].item<double>()) && std::isfinite(v[3].item<double>());
    st.real_signs += v[4].item<double>();  // ADA's r_t
    st.real_logits += static_cast<double>(d_real.numel());
    st.loss_d += v[0].item<double>() / d_steps_;
    st.d_real += v[1].item<double>() / (k * d_steps_);
    st.d_fake += v[2].item<double>() / (k * d_steps_);
    st.class_real += v[3].item<double>() / (k * d_steps_);
  }
  double norm = 0;
  bool nonfinite = false;
  if (before_update_) before_update_();
  if (!finish_update(d, norm, s, loss_finite, nonfinite)) st.skipped_d = true;
  st.nonfinite_d = st.nonfinite_d || nonfinite;
  st.grad_norm_d = norm;
}

void GanObjective::d_update_sharing_forward(TrainedModel d, DynamicLossScaler* g_scaler, const StepInputs& in,
                                            const TensorList& lat, const std::function<at::Tensor(int64_t)>& images,
                                            const ImageGrad& image_grad, StepStats& st, bool& g_loss_finite) {
  const int64_t k = micro_;
  bool loss_finite = true;
  g_loss_finite = true;
  for (int64_t j = 0; j < k; ++j) {
    at::Tensor y = lat[1].defined() ? in.local(lat[1], j) : at::Tensor();
    at::Tensor x = images(j);
    TensorList real = in.real(j);
    const at::ScalarType md = real.at(0).scalar_type();
    const bool r1_due = r1_folded_due(d);
    const bool joint = d_joint_pass_ && !r1_due;
    // The shared forward (with the real images too when joint), D gathered whole from it
    // to the second backward. Its gradients stay local until the micro-batch's last pass.
    d.model->set_gradient_sync(joint && j == k - 1);
    d.model->begin_higher_order();
    const int64_t b = x.size(0);
    // The input is the leaf whose gradient is taken (the engine's ownership check allows
    // the forward's own inputs as leaves): the fakes, or fakes and reals joined.
    at::Tensor xs = (joint ? torch::cat({x.to(real.at(0).scalar_type()), real.at(0).to(x.device())}) : x)
                        .requires_grad_(true);
    at::Tensor ys = !y.defined() ? y : joint ? torch::cat({y.to(x.device()), real.at(1).to(x.device())}) : y;
    const TensorList d_out = d.model->forward(TensorList{xs, ys});
    at::Tensor logits = d_out.at(0).to(md);
    at::Tensor d_fake = logits.narrow(0, 0, b).reshape({-1});
    at::Tensor lg = g_loss(d_fake) / k;
    // AC-GAN: G's images should be classified as the labels they were made for.
    const at::Tensor class_fake = class_loss(d_out, y, md, 0, b);
    const at::Tensor lg_all = class_fake.defined() ? lg + class_fake * (aux_class_weight_ / k) : lg;
    at::Tensor gx = torch::autograd::grad({g_scaler->scale_loss(lg_all)}, {xs}, {}, /*retain_graph=*/true)[0];
    image_grad(j, joint ? gx.narrow(0, 0, b) : gx, lg_all.detach());
    at::Tensor loss_fake = d_loss_fake(d_fake) / k, loss_real, d_real, class_real;
    if (joint) {
      const int64_t n_real = logits.size(0) - b;
      d_real = logits.narrow(0, b, n_real).reshape({-1});
      loss_real = d_loss_real(d_real) / k;
      class_real = class_loss(d_out, real.at(1), md, b, n_real);
      at::Tensor loss = loss_real + loss_fake;
      if (class_real.defined()) loss = loss + class_real * (aux_class_weight_ / k);
      d.scaler->scale_loss(loss).backward();
      d.model->end_higher_order();
    } else {
      d.scaler->scale_loss(loss_fake).backward();
      d.model->end_higher_order();
      d.model->set_gradient_sync(j == k - 1);
      RealPass rp = d_real_pass(d, real, md);
      d_real = rp.logits;
      class_real = rp.class_ce;
      loss_real = d_loss_real(d_real) / k;
      st.r1 += rp.r1 / d_steps_;
    }
    const at::Tensor v = host(at::stack({loss_real.detach() + loss_fake.detach(), torch::sigmoid(d_real.detach()).mean(),
                                         torch::sigmoid(d_fake.detach()).mean(), lg.detach(),
                                         or_zero(class_real, lg), or_zero(class_fake, lg),
                                         d_real.detach().sign().sum().to(lg.scalar_type())}));
    loss_finite = loss_finite && std::isfinite(v[0].item<double>()) && std::isfinite(v[4].item<double>());
    st.real_signs += v[6].item<double>();  // r_t, as d_update
    st.real_logits += static_cast<double>(d_real.numel());
    g_loss_finite = g_loss_finite && std::isfinite(v[3].item<double>()) && std::isfinite(v[5].item<double>());
    st.loss_d += v[0].item<double>() / d_steps_;
    st.loss_g += v[3].item<double>();
    st.d_real += v[1].item<double>() / (k * d_steps_);
    st.d_fake += v[2].item<double>() / (k * d_steps_);
    st.class_real += v[4].item<double>() / (k * d_steps_);
    st.class_fake += v[5].item<double>() / k;
  }
  double norm = 0;
  bool nonfinite = false;
  if (before_update_) before_update_();
  if (!finish_update(d, norm, 0, loss_finite, nonfinite)) st.skipped_d = true;
  st.nonfinite_d = st.nonfinite_d || nonfinite;
  st.grad_norm_d = norm;
}

GanObjective::GPassMicro GanObjective::g_pass_micro(const StepInputs& in, const TensorList& lat, int64_t j) const {
  if (paired_) {
    const TensorList& p = paired_batch_.at(static_cast<size_t>(j));
    // The loss in the model dtype: B's (pix2pix's z holds int64 dropout seeds).
    return {p.at(0), p.at(1), p.at(2), p.at(2).scalar_type()};
  }
  return {in.local(lat[0], j), lat[1].defined() ? in.local(lat[1], j) : at::Tensor(), at::Tensor(),
          lat[0].scalar_type()};
}

bool GanObjective::g_pass(TrainedModel g, TrainedModel d, const StepInputs& in, std::vector<MicroFakes>* keep,
                          StepStats& st) {
  const int64_t k = micro_;
  // D is frozen; it is gathered for forward and backward but yields input gradients only
  // (no D parameter gradients, no D reduce-scatter).
  d.model->set_requires_grad(false);
  const TensorList gen_in = g_pass_latents(in);
  bool g_loss_finite = true;
  for (int64_t j = 0; j < k; ++j) {
    g.model->set_gradient_sync(j == k - 1);
    const auto [z, y, target, md] = g_pass_micro(in, gen_in, j);  // target: paired, the B G(A) should match
    at::Tensor fake = g.model->forward(TensorList{z, y}).at(0);
    if (keep) keep->push_back({fake.detach(), y});
    const TensorList d_out = d.model->forward(TensorList{augmented(augment_for(in, j, AugmentSite::kGPass, 0), fake), y});
    at::Tensor out = d_out.at(0).reshape({-1});
    at::Tensor loss = g_loss(out.to(md)) / k;
    at::Tensor l1;
    if (paired_) l1 = (fake.to(md) - target.to(fake.device(), md)).abs().mean() / k;
    const at::Tensor class_fake = paired_ ? at::Tensor() : class_loss(d_out, y, md);  // AC-GAN
    at::Tensor total = l1.defined() ? loss * adversarial_weight_ + l1 * l1_weight_ : loss;
    if (class_fake.defined()) total = total + class_fake * (aux_class_weight_ / k);
    g.scaler->scale_loss(total).backward();
    const at::Tensor v = host(at::stack({loss.detach(), or_zero(l1, loss), or_zero(class_fake, loss) / k}));
    g_loss_finite = g_loss_finite && std::isfinite(v.sum().item<double>());
    st.loss_g += v[0].item<double>();
    if (paired_) st.loss_l1 += v[1].item<double>();
    st.class_fake += v[2].item<double>();
  }
  d.model->set_requires_grad(true);
  return g_loss_finite;
}

namespace {

// Whether every gradient shard of `m` is finite on this rank. One reduction per shard in
// float64, which propagates any NaN or Inf, and no temporary of the shard's size (an
// isfinite() mask would allocate a byte per element: 0.5 GB for a 5e8-element shard).
bool grads_finite(ShardedModel& m) {
  torch::NoGradGuard no_grad;
  bool finite = true;
  for (auto& u : m.units()) {
    if (!finite) break;
    if (u->grad_offloaded() && !u->grad_in_tier()) continue;  // zeros: nothing to read
    u->with_grad_shard([&](at::Tensor& g) {  // offloaded: read from the tier
      if (g.defined() && g.numel() > 0 && !std::isfinite(g.sum(at::kDouble).item<double>())) finite = false;
    }, false);
  }
  return finite;
}

}  // namespace

bool GanObjective::r1_folded_due(TrainedModel d) const {
  return !separate_reg_ && r1_gamma_ > 0 && d.optim->step_count() % r1_every_ == 0;
}

GanObjective::RealPass GanObjective::d_real_pass(TrainedModel d, const TensorList& real, at::ScalarType md,
                                                 const Augment& aug) {
  const int64_t k = micro_;
  const bool r1 = r1_folded_due(d);
  // D's loss on real images, with AC-GAN's class term when on.
  auto real_loss = [&](const TensorList& out, const at::Tensor& logits, at::Tensor& ce) {
    ce = class_loss(out, real.at(1), md);
    return ce.defined() ? d_loss_real(logits) + ce * aux_class_weight_ : d_loss_real(logits);
  };
  at::Tensor ce;
  if (!r1) {
    const TensorList out = d.model->forward(TensorList{augmented(aug, real.at(0)), real.at(1)});
    at::Tensor logits = out.at(0).reshape({-1}).to(md);
    d.scaler->scale_loss(real_loss(out, logits, ce) / k).backward();
    return {logits.detach(), 0.0, ce.defined() ? ce.detach() : ce};
  }
  // R1: the gradient of D's logits with respect to the real images, kept in the graph
  // (create_graph), so that the penalty's backward differentiates it again with respect
  // to D's parameters. D stays gathered from the first forward to the second backward.
  d.model->begin_higher_order();
  // Per-sample squared norm, averaged over the batch; local means average over ranks.
  const auto [out, logits, penalty] = r1_forward(*d.model, real, md, r1_gamma_, aug);
  d.scaler->scale_loss((real_loss(out, logits, ce) + penalty * static_cast<double>(r1_every_)) / k).backward();
  d.model->end_higher_order();
  at::Tensor p = penalty.detach().to(at::kDouble).reshape({1});
  update_comm().all_reduce(p, ReduceOp::kAvg);
  return {logits.detach(), p.item<double>() / k, ce.defined() ? ce.detach() : ce};
}

std::pair<GanObjective::RealPass, at::Tensor> GanObjective::d_joint_pass(TrainedModel d, const TensorList& real,
                                                           const at::Tensor& fake, const at::Tensor& y_fake,
                                                           at::ScalarType md) {
  const int64_t k = micro_;
  const at::Tensor& x = real.at(0);
  const int64_t b_fake = fake.size(0);
  // Fake first, as BigGAN-PyTorch's G_D. G's 16-bit output widens exactly to x's dtype, and
  // D's first unit casts the batch to its compute dtype as it would each part.
  // The batch is joined on G's device: the real half comes from the host on a GPU.
  const c10::Device dev = fake.device();
  at::Tensor xs = torch::cat({fake.to(x.scalar_type()), x.to(dev)});
  at::Tensor ys = y_fake.defined() ? torch::cat({y_fake.to(dev), real.at(1).to(dev)}) : at::Tensor();
  // Split by sample first: a PatchGAN has several logits per sample.
  const TensorList out = d.model->forward(TensorList{xs, ys});
  at::Tensor logits = out.at(0).to(md);
  const int64_t n_real = logits.size(0) - b_fake;
  at::Tensor d_fake = logits.narrow(0, 0, b_fake).reshape({-1});
  at::Tensor d_real = logits.narrow(0, b_fake, n_real).reshape({-1});
  at::Tensor loss = d_loss_real(d_real) + d_loss_fake(d_fake);
  const at::Tensor ce = class_loss(out, real.at(1), md, b_fake, n_real);  // AC-GAN, real half
  if (ce.defined()) loss = loss + ce * aux_class_weight_;
  d.scaler->scale_loss(loss / k).backward();
  return {RealPass{d_real.detach(), 0.0, ce.defined() ? ce.detach() : ce}, d_fake.detach()};
}

bool GanObjective::finish_update(TrainedModel m, double& norm, int64_t step_index, bool loss_finite,
                                 bool& nonfinite) {
  m.model->reduce_across_replicas();  // HSDP: the gradient shards cross groups once per update
  Communicator& comm = update_comm();
  bool ok = m.scaler->unscale_and_vote({m.model}, comm);  // float16 only; else no collective
  if (!m.scaler->enabled()) {
    // Every rank's verdict, so that all of them skip (or abort) together. Gradient shards
    // cover every element between them at stages 2 and 3, and are whole at 0 and 1.
    at::Tensor vote = torch::full({1}, loss_finite && grads_finite(*m.model) ? 0.0 : 1.0, torch::kDouble);
    comm.all_reduce(vote, ReduceOp::kMax);
    nonfinite = vote.item<double>() != 0;
    ok = !nonfinite;
  }
  if (ok && grad_clip_ > 0) {
    ClipResult c = clip_grad_norm({m.model}, grad_clip_, comm);
    norm = c.total_norm;
    if (!c.finite) {
      ok = false;
      if (comm.rank() == 0) {
        spdlog::warn("{} update {}: gradient norm is {}; skipping its optimizer step",
                     m.model->name(), step_index, c.total_norm);
      }
    }
  }
  if (ok) {
    m.optim->step();
    m.model->after_optimizer_step();
  }
  m.model->zero_grad();
  return ok;
}

}  // namespace shardgan
