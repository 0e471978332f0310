#pragma once
/// The split placement's step, declared once: the ordered list of transfers between G's
/// and D's ranks that one step makes (split_placement.h), for an update rule, paired mode,
/// d_steps and micro-batch count. Both sides generate it with the same function; each
/// transfer a side makes names its slot, and SplitPlacement checks the slot against the
/// schedule before any byte moves, so a side whose order differs from the other's fails
/// at its first wrong transfer instead of exchanging the wrong tensors. Before the first
/// step the two sides compare the schedule's fingerprint over the world
/// (SplitPlacement::set_schedule), so a side that derived another schedule (another
/// config) is refused on every rank before any send is posted.
#include <cstdint>
#include <string>
#include <vector>

namespace shardgan {

/// What a step's order depends on (GanObjective's settings).
struct StepShape {
  bool simultaneous = false;      ///< train.update simultaneous (ParaGAN) or alternating
  bool shared_d_forward = false;  ///< train.shared_d_forward (simultaneous only)
  bool paired = false;            ///< image-to-image (pix2pix) data
  int64_t d_steps = 1;            ///< D updates per step, >= 1
  int64_t micro_batches = 1;      ///< micro-batches per update, >= 1
};

/// One transfer of the step: G's images of a micro-batch to D's ranks, or their gradients
/// dL_G/dx back to G's ranks. `d_step` is the D update whose images these are, or kGPass
/// for G's pass (D frozen; images with G's graph, whose gradients come back).
struct ScheduledTransfer {
  enum Kind : uint8_t { kImagesToD, kGradsToG };
  static constexpr int32_t kGPass = -1;
  Kind kind = kImagesToD;
  int32_t d_step = kGPass;
  int32_t micro = 0;
  bool operator==(const ScheduledTransfer& o) const {
    return kind == o.kind && d_step == o.d_step && micro == o.micro;
  }
  bool operator!=(const ScheduledTransfer& o) const { return !(*this == o); }
};

/// The step's transfers in order. Alternating (Goodfellow et al. 2014): the images of each
/// D step's micro-batches (D steps 0..d_steps-1), then G's pass (images, gradients) per
/// micro-batch. Simultaneous (ParaGAN, Shi, Li and You 2024, Fig. 5): G's pass first (D's
/// first update trains on its images, or with the shared D forward inside it), then the
/// images of D steps 1..d_steps-1. Paired data and the shared D forward move the same
/// transfers. Throws std::invalid_argument for d_steps or micro_batches < 1, and for the
/// shared D forward without the simultaneous update.
std::vector<ScheduledTransfer> split_schedule(const StepShape& shape);

/// FNV-1a over the schedule's transfers (kind, d_step, micro), in order: equal schedules
/// give equal fingerprints; any reorder, insertion or removal changes it (up to hash
/// collisions, which step_schedule's test rules out for every shape it covers).
uint64_t schedule_fingerprint(const std::vector<ScheduledTransfer>& s);

/// "G's pass, micro-batch 1: gradients to G" and the like, for errors.
std::string describe(const ScheduledTransfer& t);

}  // namespace shardgan
