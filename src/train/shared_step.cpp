// One training step under the shared placement (step_executor.h): every rank runs both
// models' passes in the update rule's order, and the step's figures are every rank's
// StepStats averaged over the world.
#include <stdexcept>
#include <vector>

#include "shardgan/optim/loss_scaler.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/step_executor.h"

namespace shardgan {

void StepExecutor::post_figures(const StepMetrics&, const std::vector<double>&) {
  throw std::logic_error("post_figures: this executor returns a step's figures from step()");
}

StepMetrics StepExecutor::finish_figures(std::vector<double>*) {
  throw std::logic_error("finish_figures: this executor returns a step's figures from step()");
}

SharedStepExecutor::SharedStepExecutor(GanObjective& obj) : obj_(obj), figures_(obj.comm_) {}

StepMetrics SharedStepExecutor::step(TrainedModel g, TrainedModel d, const StepInputs& in) {
  GanObjective& o = obj_;
  if (o.simultaneous_ && o.separate_reg_ && (o.r1_gamma_ > 0 || o.pl_.weight > 0)) {
    throw std::invalid_argument("separate regularization updates (StyleGAN2) need train.update alternating");
  }
  if (o.aug_ && (o.simultaneous_ || o.d_joint_pass_ || o.paired_)) {
    throw std::invalid_argument("ADA (augment.mode) needs train.update alternating, train.d_joint_pass false and a "
                                "model without an image input");
  }
  StepStats st;  // this rank's
  bool g_loss_finite = true;
  auto update_g = [&] {
    if (o.before_update_) o.before_update_();
    st.skipped_g = !o.finish_update(g, st.grad_norm_g, 0, g_loss_finite, st.nonfinite_g);
  };
  if (!o.simultaneous_) {
    for (int64_t s = 0; s < o.d_steps_; ++s) o.d_update(g, d, in, s, nullptr, st);
    // Separate regularization (StyleGAN2): D reg after D's updates, G reg after G's. The
    // authors run G's phases first; here, as for every family, D's come first.
    if (o.r1_update_due(in.step)) o.d_reg(d, in, st);
    g_loss_finite = o.g_pass(g, d, in, nullptr, st);
    update_g();
    if (o.pl_update_due(in.step)) o.g_reg(g, in, st);
  } else {
    // ParaGAN's update (Shi et al. 2024, Fig. 5): G_{t+1} from L_G(G_t, D_t) and D_{t+1}
    // from L_D(G_t, D_t). G's pass runs first, against the D that no update has touched
    // yet, and D's first update trains on its images, so one G forward serves both models:
    // the pass keeps them (`fakes`), or, with the shared D forward, D's first update runs
    // inside the pass (and the loop starts at D step 2). Further D steps (d_steps > 1) draw
    // their images from G_t too, so G's update waits for them; with one D step it runs
    // right after G's pass (so G's gradient shards are released before D's backward, but
    // for the shared D forward, whose pass holds D's first update).
    std::vector<GanObjective::MicroFakes> fakes;
    int64_t first_d_step = 0;
    if (o.shared_d_forward_) {
      // One D forward on each micro-batch's fakes: L_G's image gradient goes into G's
      // backward at once, and the same forward gives D's fake term.
      const int64_t k = o.micro_;
      TensorList lat = in.latents();
      std::vector<at::Tensor> out(static_cast<size_t>(k));  // G's images, in G's graph
      auto images = [&](int64_t j) {
        g.model->set_gradient_sync(j == k - 1);
        at::Tensor y = lat[1].defined() ? in.local(lat[1], j) : at::Tensor();
        out[static_cast<size_t>(j)] = g.model->forward(TensorList{in.local(lat[0], j), y}).at(0);
        return out[static_cast<size_t>(j)].detach();
      };
      auto image_grad = [&](int64_t j, const at::Tensor& gx, const at::Tensor&) {
        out[static_cast<size_t>(j)].backward(gx.to(out[static_cast<size_t>(j)].scalar_type()));
        out[static_cast<size_t>(j)] = at::Tensor();
      };
      o.d_update_sharing_forward(d, g.scaler, in, lat, images, image_grad, st, g_loss_finite);
      first_d_step = 1;
    } else {
      g_loss_finite = o.g_pass(g, d, in, &fakes, st);
    }
    if (o.d_steps_ == 1) update_g();
    for (int64_t s = first_d_step; s < o.d_steps_; ++s) o.d_update(g, d, in, s, s == 0 ? &fakes : nullptr, st);
    if (o.d_steps_ > 1) update_g();
  }
  // Losses and D outputs on the host, as the engine's other scalars: the world's exchange
  // of host tensors runs over MPI, also beside NCCL (losses on a GPU are copied).
  st.pl_mean = o.pl_mean_;
  StepMetrics r;
  static_cast<StepStats&>(r) = figures_.exchange(st, RankRole::kBoth);
  r.loss_scale_d = d.scaler->scale();
  r.loss_scale_g = g.scaler->scale();
  return r;
}

namespace {

using Alive = PhaseBuilder::Alive;

// Shared placement: GanObjective::step.
void shared_phases(const PhaseShape& s, PhaseBuilder& b) {
  const int64_t k = s.step.micro_batches;
  // D's passes in a D update: real and fake (or joint) forwards and backwards, gathered
  // whole for the real pass when R1 is due (d_real_pass's begin_higher_order).
  const Alive d_training{true, s.r1, true, true};
  const Alive d_frozen{true, false, false, false};  // G's pass: D's input gradients only
  const Alive g_pass{true, false, true, true};
  const Alive g_update{false, false, false, true};
  const Alive none{};
  if (!s.step.simultaneous) {
    // step: d_steps x d_update (G's images under no_grad, D's update), g_pass, update_g.
    // Each update's finish_update ends in zero_grad, which releases the model's shards: no
    // phase holds both models' shards.
    for (int64_t i = 0; i < s.step.d_steps; ++i) {
      b.add(PhaseBuilder::d_update_name(i), "GanObjective::d_update (G forward under no_grad, D forward and backward)",
            {true, false, false, false}, d_training);
      b.add(PhaseBuilder::d_update_name(i) + ": optimizer step", "GanObjective::finish_update from d_update", none, g_update);
    }
    const Alive whole_training{true, true, true, true};  // begin_higher_order to the second backward
    if (s.r1_update) {
      b.add("D reg (R1)", "GanObjective::d_reg (D gathered whole, double backward)", none, whole_training);
      b.add("D reg: optimizer step", "GanObjective::finish_update from d_reg", none, g_update);
    }
    b.add("G pass", "GanObjective::g_pass (G forward and backward through the frozen D)", g_pass, d_frozen);
    b.add("G update", "GanObjective::finish_update from step's update_g", g_update, none);
    if (s.pl_update) {
      b.add("G reg (path length)", "GanObjective::g_reg (G gathered whole, double backward)", whole_training, none);
      b.add("G reg: optimizer step", "GanObjective::finish_update from g_reg", g_update, none);
    }
    return;
  }
  // Simultaneous: G's update waits for every D step when d_steps > 1 (they draw their images
  // from G_t), so G's released shards stay allocated through D's updates.
  const bool g_waits = s.step.d_steps > 1;
  const Alive g_held{false, false, false, g_waits};
  const Alive g_images{true, false, false, g_waits};  // D steps 2..: G's images under no_grad
  int64_t first = 0;
  int64_t kept = 0;
  if (s.step.shared_d_forward) {
    // d_update_sharing_forward: per micro-batch G's forward, one D forward gathered whole
    // (begin_higher_order) to the end of its two backwards, G's backward of dL_G/dx (G's
    // gradients), D's backward of its fake term (D's gradients), D's real pass; then D's
    // update, while G's gradient shards wait for G's update (after it).
    b.add("D update 1 sharing G's forward",
          "GanObjective::d_update_sharing_forward from step (G and D forward and backward)", g_pass,
          {true, true, true, true});
    b.add("D update 1: optimizer step", "GanObjective::finish_update from d_update_sharing_forward",
          {false, false, false, true}, g_update);
    first = 1;
  } else {
    // g_pass keeping its images (`fakes`, alive to the end of the step's branch), which D's
    // first update trains on.
    b.add("G pass (keeping its images)", "GanObjective::g_pass from step (keep = &fakes)", g_pass, d_frozen, k);
    kept = k;
  }
  if (!g_waits) b.add("G update", "GanObjective::finish_update from step's update_g (d_steps 1)", g_update, none, kept);
  for (int64_t i = first; i < s.step.d_steps; ++i) {
    // D update 1 without the shared forward trains on the kept images: no G forward.
    const Alive g = i == 0 ? g_held : g_images;
    b.add(PhaseBuilder::d_update_name(i),
          i == 0 ? "GanObjective::d_update on g_pass's images" : "GanObjective::d_update (G forward under no_grad)", g,
          d_training, kept);
    b.add(PhaseBuilder::d_update_name(i) + ": optimizer step", "GanObjective::finish_update from d_update", g_held, g_update, kept);
  }
  if (g_waits) {
    b.add("G update", "GanObjective::finish_update from step's update_g (d_steps > 1)", g_update, none, kept);
  }
}

}  // namespace

std::vector<StepPhase> SharedStepExecutor::phases(const PhaseShape& shape) {
  PhaseBuilder b(shape);
  shared_phases(shape, b);
  return b.take();
}

}  // namespace shardgan
