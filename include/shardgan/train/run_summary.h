#pragma once
/// What rank 0 shows about a run as it goes (the progress line's text) and when it ends
/// (a short summary: steps, wall time, best FID, where everything is, peak RSS per rank).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardgan {

struct StepMetrics;
struct TrainConfig;

struct RunSummary {
  int64_t steps_run = 0;  ///< optimizer steps this process ran (a resumed run counts from its start)
  double wall_s = 0;      ///< wall time of Trainer::run (seconds)
  /// Best (lowest) FID of G and of its EMA, and the step of each; step -1 if none yet.
  double best_fid = std::numeric_limits<double>::infinity(), best_fid_ema = best_fid;
  int64_t best_fid_step = -1, best_fid_ema_step = -1;
  double last_fid = -1;   ///< the latest FID of G (-1 before the first evaluation)

  /// Takes one evaluation record (Trainer::evaluate's JSON: step, fid, fid_ema, ...).
  void add_eval(const nlohmann::json& eval);

  /// Local (rank 0). Logs the summary: steps and wall time, best FID (and EMA's) with its
  /// step, where the samples, plots, metrics and checkpoints are, and `peak_rss_bytes` per
  /// rank (index = rank) and summed, in GiB.
  void log(const TrainConfig& cfg, int64_t final_step, const std::vector<int64_t>& peak_rss_bytes,
           const std::string& samples, bool plots, const std::string& checkpoint) const;
};

/// The progress line's text after step `m`: step, losses, images/s, ETA from the smoothed
/// seconds per step `avg_step_s`, and the latest FID when there is one.
std::string progress_text(const StepMetrics& m, int64_t total_steps, int64_t global_batch, double avg_step_s,
                          const RunSummary& summary);

}  // namespace shardgan
