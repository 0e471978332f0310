#include "shardgan/train/step_schedule.h"

#include <stdexcept>

namespace shardgan {

std::vector<ScheduledTransfer> split_schedule(const StepShape& shape) {
  if (shape.d_steps < 1 || shape.micro_batches < 1) {
    throw std::invalid_argument("split_schedule: d_steps and micro_batches must be >= 1");
  }
  if (shape.shared_d_forward && !shape.simultaneous) {
    throw std::invalid_argument("split_schedule: the shared D forward needs the simultaneous update");
  }
  using T = ScheduledTransfer;
  std::vector<T> s;
  const auto k = static_cast<int32_t>(shape.micro_batches);
  const auto n = static_cast<int32_t>(shape.d_steps);
  auto d_step_images = [&](int32_t step) {
    for (int32_t j = 0; j < k; ++j) s.push_back({T::kImagesToD, step, j});
  };
  auto g_pass = [&] {
    for (int32_t j = 0; j < k; ++j) {
      s.push_back({T::kImagesToD, T::kGPass, j});
      s.push_back({T::kGradsToG, T::kGPass, j});
    }
  };
  if (!shape.simultaneous) {
    for (int32_t step = 0; step < n; ++step) d_step_images(step);
    g_pass();
  } else {
    g_pass();  // D step 0 trains on these images
    for (int32_t step = 1; step < n; ++step) d_step_images(step);
  }
  return s;
}

uint64_t schedule_fingerprint(const std::vector<ScheduledTransfer>& s) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(s.size());
  for (const auto& t : s) {
    mix(static_cast<uint64_t>(t.kind));
    mix(static_cast<uint64_t>(static_cast<int64_t>(t.d_step)));
    mix(static_cast<uint64_t>(static_cast<int64_t>(t.micro)));
  }
  return h;
}

std::string describe(const ScheduledTransfer& t) {
  std::string where = t.d_step == ScheduledTransfer::kGPass ? "G's pass" : "D step " + std::to_string(t.d_step);
  return where + ", micro-batch " + std::to_string(t.micro) +
         (t.kind == ScheduledTransfer::kImagesToD ? ": images to D" : ": gradients to G");
}

}  // namespace shardgan
