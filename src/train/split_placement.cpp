#include "shardgan/train/split_placement.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/util/test_control.h"

namespace shardgan {

SplitPlacement::SplitPlacement(Communicator& world, Communicator& group, int generator_ranks, int64_t micro_batch,
                               std::vector<int64_t> sample_shape, at::ScalarType image_dtype)
    : world_(world), group_(group), k_(generator_ranks), n_(world.world_size()), rank_(world.rank()),
      holds_g_(world.rank() < generator_ranks), micro_(micro_batch), sample_shape_(std::move(sample_shape)),
      dtype_(image_dtype) {
  // Test-only (split_shape_mismatch): D's ranks expect images of one more channel.
  if (!holds_g_ && test_control("split_shape_mismatch") && !sample_shape_.empty()) ++sample_shape_[0];
  if (k_ < 1 || k_ >= n_) {
    throw std::invalid_argument("split placement needs 1 <= generator ranks < world size; got " + std::to_string(k_) +
                                " of " + std::to_string(n_));
  }
  if (micro_ % k_ != 0 || micro_ % (n_ - k_) != 0) {
    throw std::invalid_argument("split placement cuts each micro-batch of " + std::to_string(micro_) + " images into " +
                                std::to_string(k_) + " slices for G and " + std::to_string(n_ - k_) +
                                " for D: it must divide by both");
  }
}

SplitPlacement::~SplitPlacement() = default;

double SplitPlacement::take_idle_s() {
  const double s = idle_s_;
  idle_s_ = 0;
  return s;
}

int64_t SplitPlacement::take_sent_bytes() {
  const int64_t now = world_.stats().sent_bytes, b = now - sent_mark_;
  sent_mark_ = now;
  return b;
}

void SplitPlacement::set_schedule(std::vector<ScheduledTransfer> schedule) {
  // One all-gather: each rank's schedule fingerprint and the images it will send or receive
  // (micro-batch, C, H, W, dtype), so that neither mismatch reaches a transfer.
  constexpr int kFields = 6;
  const uint64_t mine = schedule_fingerprint(schedule);
  at::Tensor rec = torch::empty({kFields}, torch::kLong), all = torch::empty({n_ * kFields}, torch::kLong);
  int64_t* r0 = rec.data_ptr<int64_t>();
  std::memcpy(r0, &mine, sizeof mine);
  r0[1] = micro_;
  for (int i = 0; i < 3; ++i) r0[2 + i] = i < static_cast<int>(sample_shape_.size()) ? sample_shape_[i] : 0;
  r0[5] = static_cast<int64_t>(dtype_);
  world_.all_gather(all, rec);
  const int64_t* a = all.data_ptr<int64_t>();
  std::string differ;
  for (int r = 1; r < n_; ++r) {
    if (a[r * kFields] != a[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!differ.empty()) {
    throw std::runtime_error("split placement, rank " + std::to_string(rank_) +
                             ": G's and D's step schedules differ (ranks " + differ +
                             " declare another order of transfers than rank 0): the two sides would exchange the "
                             "wrong tensors. Every rank must run the same shardgan build and resolved config");
  }
  auto images = [&](int r) {
    const int64_t* x = a + r * kFields;
    return "[" + std::to_string(x[1]) + " per micro-batch, " + std::to_string(x[2]) + ", " + std::to_string(x[3]) +
           ", " + std::to_string(x[4]) + "] " + c10::toString(static_cast<at::ScalarType>(x[5]));
  };
  for (int r = 1; r < n_; ++r) {
    if (!std::equal(a + 1, a + kFields, a + r * kFields + 1)) {
      throw std::runtime_error("split placement, rank " + std::to_string(rank_) + ": the images G's ranks send to D's "
                               "ranks (and their gradients back) would not fit: rank 0 (G's) has " + images(0) +
                               ", rank " + std::to_string(r) + " (" + (r < k_ ? "G's" : "D's") + ") " + images(r) +
                               "; nothing was sent. Every rank must run the same shardgan build and resolved config");
    }
  }
  schedule_ = std::move(schedule);
  next_ = 0;
}

void SplitPlacement::end_step() {
  if (next_ != schedule_.size()) {
    throw std::logic_error("split placement, rank " + std::to_string(rank_) + ": the step ended after " +
                           std::to_string(next_) + " of its schedule's " + std::to_string(schedule_.size()) +
                           " transfers");
  }
}

void SplitPlacement::expect(const ScheduledTransfer& slot) {
  if (next_ >= schedule_.size() || schedule_[next_] != slot) {
    throw std::logic_error("split placement, rank " + std::to_string(rank_) + ": transfer '" + describe(slot) +
                           "' is not the step schedule's next, " +
                           (next_ < schedule_.size() ? "'" + describe(schedule_[next_]) + "'" : "none (it has ended)") +
                           "; nothing was sent");
  }
  ++next_;
}

at::Tensor SplitPlacement::images_to_d(const ScheduledTransfer& slot, const at::Tensor& g_slice) {
  if (slot.kind != ScheduledTransfer::kImagesToD) throw std::logic_error("images_to_d: slot '" + describe(slot) + "'");
  expect(slot);
  return transfer(g_slice, /*from_g=*/true);
}

at::Tensor SplitPlacement::grads_to_g(const ScheduledTransfer& slot, const at::Tensor& d_slice) {
  if (slot.kind != ScheduledTransfer::kGradsToG) throw std::logic_error("grads_to_g: slot '" + describe(slot) + "'");
  expect(slot);
  return transfer(d_slice, /*from_g=*/false);
}

at::Tensor SplitPlacement::transfer(const at::Tensor& mine, bool from_g) {
  if (before_transfer_) before_transfer_();
  const int m = n_ - k_;
  const int64_t bg = micro_ / k_, bd = micro_ / m;  // slice sizes on each side
  // Global image range [lo, hi) of a rank of either side.
  auto range = [&](int world_rank) {
    return world_rank < k_ ? std::pair<int64_t, int64_t>{world_rank * bg, (world_rank + 1) * bg}
                           : std::pair<int64_t, int64_t>{(world_rank - k_) * bd, (world_rank - k_ + 1) * bd};
  };
  const bool sending = holds_g_ == from_g;
  const auto [lo, hi] = range(rank_);
  std::vector<PeerBuffer> sends, recvs;
  at::Tensor out;
  at::Tensor src;
  if (sending) {
    src = mine.to(dtype_).contiguous();
    if (src.size(0) != hi - lo) throw std::invalid_argument("split placement: a slice of " + std::to_string(src.size(0)) +
                                                            " images, not " + std::to_string(hi - lo));
  } else {
    std::vector<int64_t> shape{hi - lo};
    shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
    out = torch::empty(shape, torch::TensorOptions().dtype(dtype_));
  }
  const int first = holds_g_ ? k_ : 0, last = holds_g_ ? n_ : k_;  // the other side's ranks
  for (int p = first; p < last; ++p) {
    const auto [plo, phi] = range(p);
    const int64_t a = std::max(lo, plo), b = std::min(hi, phi);
    if (a >= b) continue;
    if (sending) {
      sends.push_back({p, src.narrow(0, a - lo, b - a)});
    } else {
      recvs.push_back({p, out.narrow(0, a - lo, b - a)});
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  world_.send_recv_async(sends, recvs)->wait();
  idle_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace shardgan
