#include "shardgan/train/run_summary.h"

#include <cmath>

#include <spdlog/spdlog.h>

#include "shardgan/train/config.h"
#include "shardgan/train/objective.h"
#include "shardgan/util/progress.h"

namespace shardgan {

void RunSummary::add_eval(const nlohmann::json& eval) {
  const int64_t step = eval.value("step", int64_t{-1});
  if (eval.contains("fid")) {
    last_fid = eval["fid"].get<double>();
    if (last_fid < best_fid) best_fid = last_fid, best_fid_step = step;
  }
  if (eval.contains("fid_ema")) {
    const double f = eval["fid_ema"].get<double>();
    if (f < best_fid_ema) best_fid_ema = f, best_fid_ema_step = step;
  }
}

void RunSummary::log(const TrainConfig& cfg, int64_t final_step, const std::vector<int64_t>& peak_rss_bytes,
                     const std::string& samples, bool plots, const std::string& checkpoint) const {
  constexpr double kGiB = 1073741824.0;
  spdlog::info("done: step {}; this run trained {} steps in {} of wall time ({:.2f} s per step, evaluations, "
               "samples and checkpoints included)", final_step, steps_run, format_duration(wall_s),
               steps_run > 0 ? wall_s / steps_run : 0.0);
  if (best_fid_step >= 0) {
    std::string ema;
    if (best_fid_ema_step >= 0) ema = fmt::format("; EMA {:.2f} at step {}", best_fid_ema, best_fid_ema_step);
    spdlog::info("best FID:    {:.2f} at step {}{}", best_fid, best_fid_step, ema);
  }
  spdlog::info("samples:     {}", samples);
  if (plots) spdlog::info("plots:       {}/plots/*.png", cfg.run_dir);
  spdlog::info("metrics:     {}/metrics.jsonl", cfg.run_dir);
  if (checkpoint.empty()) {
    spdlog::info("checkpoints: none saved (train.final_checkpoint is false)");
  } else {
    spdlog::info("checkpoints: {} (latest: {})", cfg.run_dir + "/checkpoints", checkpoint);
  }
  std::string per_rank;
  int64_t sum = 0;
  for (size_t r = 0; r < peak_rss_bytes.size(); ++r) {
    per_rank += fmt::format("{}{:.2f}", r ? ", " : "", peak_rss_bytes[r] / kGiB);
    sum += peak_rss_bytes[r];
  }
  spdlog::info("peak RSS:    [{}] GiB per rank, {:.2f} GiB summed", per_rank, sum / kGiB);
}

std::string progress_text(const StepMetrics& m, int64_t total_steps, int64_t global_batch, double avg_step_s,
                          const RunSummary& summary) {
  const double eta_s = avg_step_s * static_cast<double>(total_steps - m.step);
  std::string text = fmt::format("step {}/{} ({:.0f}%) | loss_D {:.3f} loss_G {:.3f} | {} img/s | ETA {}",
                                 m.step, total_steps, 100.0 * m.step / std::max<int64_t>(total_steps, 1), m.loss_d,
                                 m.loss_g, format_rate(global_batch / std::max(avg_step_s, 1e-9)),
                                 format_duration(eta_s));
  if (summary.last_fid >= 0) text += fmt::format(" | FID {:.1f}", summary.last_fid);
  return text;
}

}  // namespace shardgan
