#pragma once
/// A step's statistics, typed: what one rank measured in one training step (losses, D's
/// outputs, the skip and non-finite verdicts, the class terms, the L1 term, idle and busy
/// times, bytes between groups), and the one function that combines every rank's into the
/// step's figures, shared by both placements. No statistic is addressed by position: the
/// packed row that travels in the collective is laid out by for_each_stat, which both the
/// packing and the reduction walk.
#include <cstdint>
#include <vector>

namespace shardgan {

/// Which model's ranks measure a statistic: the ranks that run that model's part of the
/// step. Under shared placement every rank runs both; under split placement G's ranks
/// measure the generator's and D's ranks the discriminator's (D scores G's images, so G's
/// adversarial loss and G's class term are the discriminator's).
enum class StatSide : uint8_t { kGenerator, kDiscriminator, kEvery };

/// How the measuring ranks' values combine into the step's figure.
enum class StatReduce : uint8_t {
  kMean,  ///< mean over the measuring ranks (each rank's part of the global batch)
  kSame,  ///< identical on the measuring ranks already (after their group's vote): the first's
  kAny,   ///< a verdict: true when any measuring rank says so
  kSum,   ///< summed over every rank (bytes)
};

/// What one rank measured in one step (before reduce_step_stats), or the step's figures
/// (after it, identical on every rank). Units: losses and D outputs are global-batch
/// means in float64; times in seconds; bytes in bytes.
struct StepStats {
  double loss_d = 0;  ///< D's loss averaged over the D steps
  double loss_g = 0;  ///< G's adversarial loss
  /// Image-conditioned models: mean |G(A) - B| of G's pass, before the weight (0 otherwise).
  double loss_l1 = 0;
  double d_real = 0, d_fake = 0;  ///< mean sigmoid(D(x)) and sigmoid(D(G(z))), D steps
  /// AC-GAN's class term (GanObjective::set_aux_class_weight; 0 when off): the cross-entropy
  /// of D's class head on the real images (mean over the D updates) and on G's images.
  double class_real = 0, class_fake = 0;
  double r1 = 0;  ///< R1 penalty of this step's D updates (0 if none ran)
  /// Path-length regularization (GanObjective::set_path_length; 0 when no G reg update ran
  /// this step): the penalty mean((a - m)^2) before its weight, and the running mean m of
  /// path lengths after the update.
  double pl = 0, pl_mean = 0;
  /// D's logits on real images in this step's D updates and D reg (after augmentation when
  /// ADA is on): the sum of their signs and their count, summed over the ranks (ADA's r_t,
  /// AdaptiveAugment::after_step).
  double real_signs = 0, real_logits = 0;
  double grad_norm_d = 0, grad_norm_g = 0;  ///< global gradient norms (0 unless clipping)
  bool skipped_d = false, skipped_g = false;  ///< an update skipped (float16 overflow, inf norm, NaN)
  /// A NaN or Inf in the model's loss or gradients on some rank: its update was skipped.
  bool nonfinite_d = false, nonfinite_g = false;
  /// Split placement (0 otherwise): seconds each group's ranks waited for the other group
  /// (averaged over the group), seconds each group was busy, and bytes sent between the
  /// groups (all ranks summed).
  double idle_g_s = 0, idle_d_s = 0, busy_g_s = 0, busy_d_s = 0;
  int64_t bytes_between_groups = 0;
};

/// Calls `f(name, side, reduce, member)` for every field of `s`, in one fixed order (the
/// packed row's layout). `S` is StepStats or const StepStats; `member` is a reference of
/// the field's own type (double, bool or int64_t). A field missing here fails step_stats'
/// test, which counts the bytes the walk covers against sizeof(StepStats).
template <class S, class F>
void for_each_stat(S& s, F&& f) {
  using D = StatSide;
  using R = StatReduce;
  f("loss_d", D::kDiscriminator, R::kMean, s.loss_d);
  f("loss_g", D::kDiscriminator, R::kMean, s.loss_g);
  f("loss_l1", D::kGenerator, R::kMean, s.loss_l1);
  f("d_real", D::kDiscriminator, R::kMean, s.d_real);
  f("d_fake", D::kDiscriminator, R::kMean, s.d_fake);
  f("class_real", D::kDiscriminator, R::kMean, s.class_real);
  f("class_fake", D::kDiscriminator, R::kMean, s.class_fake);
  f("r1", D::kDiscriminator, R::kSame, s.r1);
  f("pl", D::kGenerator, R::kMean, s.pl);
  f("pl_mean", D::kGenerator, R::kSame, s.pl_mean);
  f("real_signs", D::kDiscriminator, R::kSum, s.real_signs);
  f("real_logits", D::kDiscriminator, R::kSum, s.real_logits);
  f("grad_norm_d", D::kDiscriminator, R::kSame, s.grad_norm_d);
  f("grad_norm_g", D::kGenerator, R::kSame, s.grad_norm_g);
  f("skipped_d", D::kDiscriminator, R::kAny, s.skipped_d);
  f("skipped_g", D::kGenerator, R::kAny, s.skipped_g);
  f("nonfinite_d", D::kDiscriminator, R::kAny, s.nonfinite_d);
  f("nonfinite_g", D::kGenerator, R::kAny, s.nonfinite_g);
  f("idle_g_s", D::kGenerator, R::kMean, s.idle_g_s);
  f("idle_d_s", D::kDiscriminator, R::kMean, s.idle_d_s);
  f("busy_g_s", D::kGenerator, R::kMean, s.busy_g_s);
  f("busy_d_s", D::kDiscriminator, R::kMean, s.busy_d_s);
  f("bytes_between_groups", D::kEvery, R::kSum, s.bytes_between_groups);
}

/// Which parts of the step a rank ran: both models (shared placement), or one (split).
enum class RankRole : uint8_t { kBoth, kGenerator, kDiscriminator };

/// Doubles per packed row: the role, then one per field of for_each_stat.
int64_t step_stats_row_size();

/// This rank's row for the exchange: [role, fields in for_each_stat's order] as doubles
/// (bools as 0/1; the byte count is exact below 2^53). Local.
std::vector<double> pack_step_stats(const StepStats& s, RankRole role);

/// Combines every rank's packed row (`rows`: n_ranks rows of step_stats_row_size()
/// doubles, in rank order, as an all-gather leaves them) into the step's figures: each
/// field over the ranks whose role measures it (StatSide), by its StatReduce, in rank order,
/// so every rank computes the same bits. A field no rank measured is 0. Throws
/// std::invalid_argument on a row whose role is not a RankRole. Local.
StepStats reduce_step_stats(const double* rows, int64_t n_ranks);

}  // namespace shardgan
