#pragma once
/// train.placement: split (ParaGAN's asymmetric placement, Shi, Li and You 2024, Sec. 4):
/// ranks [0, K) hold only G, sharded over their own communicator, and ranks [K, N) only
/// D. What crosses between the two groups is G's images and, for G's update, their
/// gradients dL_G/dx, point to point over the world communicator (send_recv_async).
///
/// Batch layout: a global micro-batch of B images is cut into K equal contiguous slices
/// on G's side (G rank i makes images [i B/K, (i+1) B/K)) and into N - K on D's side (D
/// rank j scores [j B/(N-K), (j+1) B/(N-K))). Each G rank sends each D rank the part of
/// its slice that the D rank scores, so the bytes between the groups per transfer are B
/// images, whatever K is.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shardgan/train/step_schedule.h"

namespace shardgan {

class Communicator;
class Work;

class SplitPlacement {
 public:
  /// `world`: every rank of the job (N >= 2); `group`: this rank's side (made by
  /// Communicator::split: ranks [0, K) and [K, N)). `micro_batch`: images per global
  /// micro-batch B, divisible by K and by N - K. `sample_shape`: one image, {C, H, W};
  /// `image_dtype`: G's compute dtype, in which images and their gradients travel.
  /// Throws std::invalid_argument when K is not in [1, N) or B does not divide.
  SplitPlacement(Communicator& world, Communicator& group, int generator_ranks, int64_t micro_batch,
                 std::vector<int64_t> sample_shape, at::ScalarType image_dtype);
  ~SplitPlacement();

  bool holds_generator() const { return holds_g_; }
  int generator_ranks() const { return k_; }
  at::ScalarType image_dtype() const { return dtype_; }
  /// K / (N - K): D's ranks differentiate a mean over their B/(N-K) images, and G's
  /// gradient shards are averaged over K ranks, so the gradients G's ranks receive are
  /// scaled by this to make G's gradient the global batch mean's, as under shared.
  double grad_scale() const { return static_cast<double>(k_) / (n_ - k_); }
  Communicator& world() { return world_; }
  /// This rank's side: G's ranks or D's ranks.
  Communicator& group() { return group_; }

  /// Collective over the world: takes the step's schedule (step_schedule.h) that this
  /// side's transfers follow from now on, and compares its fingerprint and the images this
  /// rank sends or receives (micro-batch, sample shape, dtype) with every rank's (one
  /// all-gather of 6 int64), before any transfer. Throws std::runtime_error on every rank,
  /// naming the ranks whose schedule differs from rank 0's, or naming both images' shapes
  /// when they differ.
  void set_schedule(std::vector<ScheduledTransfer> schedule);
  /// Starts a step's walk of the schedule. Local.
  void begin_step() { next_ = 0; }
  /// Ends it. Throws std::logic_error when the step made fewer transfers than its schedule
  /// has. Local.
  void end_step();

  /// Both sides call it at the same point of the step (point to point, with the
  /// communicator's timeout), naming the transfer's `slot`, which must be the schedule's
  /// next (std::logic_error before any byte moves otherwise, naming both). G's ranks pass
  /// their slice ([B/K, C, H, W], image_dtype()) and get an undefined tensor back; D's
  /// ranks pass an undefined tensor and get their slice ([B/(N-K), C, H, W],
  /// image_dtype()). Sends are waited for before it returns.
  at::Tensor images_to_d(const ScheduledTransfer& slot, const at::Tensor& g_slice);
  /// The reverse: D's ranks pass the gradients of their slice; G's ranks get theirs.
  at::Tensor grads_to_g(const ScheduledTransfer& slot, const at::Tensor& d_slice);

  /// `f` runs at the start of every images_to_d and grads_to_g on both sides, before any
  /// byte moves. The two sides' transfers match one to one and in order, so `f` may run a
  /// collective over the world (the trainer's train.preempt_grace_s vote) and may throw
  /// on every rank alike to leave the step. Local.
  void set_before_transfer(std::function<void()> f) { before_transfer_ = std::move(f); }

  /// Seconds this rank has spent waiting in transfers since the last take_idle_s() (a
  /// rank waits when the other side has not reached the matching transfer yet).
  double take_idle_s();
  /// Bytes this rank sent to the other side since the last take_sent_bytes() (the world
  /// communicator's CommStats::sent_bytes: the transfers are its only point-to-point use).
  int64_t take_sent_bytes();

 private:
  /// Moves slices from `from_g` (true: G -> D) side to the other.
  at::Tensor transfer(const at::Tensor& mine, bool from_g);
  /// Checks `slot` against the schedule's next transfer and moves on.
  void expect(const ScheduledTransfer& slot);
  std::vector<ScheduledTransfer> schedule_;
  size_t next_ = 0;
  Communicator& world_;
  Communicator& group_;
  int k_, n_, rank_;
  bool holds_g_;
  int64_t micro_;
  std::vector<int64_t> sample_shape_;
  at::ScalarType dtype_;
  std::function<void()> before_transfer_;
  double idle_s_ = 0;
  int64_t sent_mark_ = 0;  // world_.stats().sent_bytes at the last take_sent_bytes()
};

}  // namespace shardgan
