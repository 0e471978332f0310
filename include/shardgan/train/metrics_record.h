#pragma once
/// The fields of a run's metrics.jsonl, in one table: what PeriodicActions writes and what
/// docs/metrics.md lists both come from metrics_fields(), so that a field cannot be written
/// without being documented (append_metrics_record refuses it) and the page cannot drift
/// from the table (ctest `docs` compares it with `shardgan-train --metrics-reference`).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardgan {

/// The two kinds of line in metrics.jsonl: one per logged training step
/// (PeriodicActions::log_step, every `train.log_every` steps and the last) and one per
/// evaluation (Trainer::evaluate, every `train.eval_every` steps with `eval.enabled`).
enum class MetricsRecord : uint8_t { kStep, kEvaluation };

/// One field of a metrics.jsonl line.
struct MetricsField {
  std::string_view name;     ///< the JSON key (an evaluation score's key without its suffix)
  MetricsRecord record;      ///< which kind of line carries it
  std::string_view type;     ///< JSON type: integer, number, boolean, string, array of numbers
  std::string_view unit;     ///< seconds, bytes, ... ("" when dimensionless)
  std::string_view when;     ///< "always", or the configuration under which it is written
  std::string_view meaning;  ///< what was measured, and how it was combined over ranks
  /// An evaluation score written once per model scored: the key alone for G, then with
  /// the suffixes of kScoreSuffixes (its EMA, and both on truncated latents).
  bool per_model = false;
};

/// The suffixes of a per-model evaluation score: G on truncated latents, G's EMA, the EMA on
/// truncated latents (put_scores, evaluation.h).
inline constexpr std::string_view kScoreSuffixes[] = {"_trunc", "_ema", "_ema_trunc"};

/// Every field of metrics.jsonl, training records first, in the order the page lists them.
const std::vector<MetricsField>& metrics_fields();

/// docs/metrics.md: the fields of both records as Markdown tables, with how to read the file
/// (`shardgan-train --metrics-reference`). Local.
std::string metrics_reference_markdown();

/// The keys of `record` that metrics_fields() does not list for `kind` (a per-model score
/// with any of kScoreSuffixes counts as listed), in the record's order; empty when every
/// key is listed. Local.
std::vector<std::string> unlisted_metrics_fields(const nlohmann::json& record, MetricsRecord kind);

/// Appends `record` as one line to <run_dir>/metrics.jsonl. Throws std::logic_error naming
/// every key that metrics_fields() does not list (a field docs/metrics.md would not
/// document: a defect in shardgan, caught by any test that writes it) without writing
/// the line. Local; rank 0 calls it.
void append_metrics_record(const std::string& run_dir, const nlohmann::json& record, MetricsRecord kind);

}  // namespace shardgan
