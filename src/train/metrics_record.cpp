// docs/metrics.md's table, and the writer of metrics.jsonl that refuses a field it lacks.
#include "shardgan/train/metrics_record.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace shardgan {
namespace {

constexpr auto kStep = MetricsRecord::kStep;
constexpr auto kEval = MetricsRecord::kEvaluation;
constexpr const char* kAlways = "always";

}  // namespace

const std::vector<MetricsField>& metrics_fields() {
  // The step record: PeriodicActions::log_step (StepMetrics, and StepStats reduced over the
  // ranks by reduce_step_stats). The evaluation record: Trainer::evaluate and put_scores.
  static const std::vector<MetricsField> fields = {
      {"step", kStep, "integer", "steps", kAlways, "steps done, this one included"},
      {"loss_d", kStep, "number", "", kAlways,
       "D's loss, averaged over the step's D updates; a global-batch mean over the ranks"},
      {"loss_g", kStep, "number", "", kAlways, "G's adversarial loss; a global-batch mean over the ranks"},
      {"d_real", kStep, "number", "", kAlways, "mean sigmoid(D(x)) on the real images of the D updates"},
      {"d_fake", kStep, "number", "", kAlways, "mean sigmoid(D(G(z))) on the generated images of the D updates"},
      {"step_time_s", kStep, "number", "seconds", kAlways,
       "wall time of the step on rank 0 (under split placement with the wait for the step's figures)"},
      {"images_per_s", kStep, "number", "images/s", kAlways, "`train.global_batch` / `step_time_s`"},
      {"world_size", kStep, "integer", "ranks", kAlways, "ranks in the run"},
      {"g_model_state_bytes", kStep, "integer", "bytes", kAlways,
       "G's parameters, gradients and optimizer state held in memory by rank 0 (its accounting)"},
      {"d_model_state_bytes", kStep, "integer", "bytes", kAlways, "the same for D"},
      {"peak_rss_bytes_rank0", kStep, "integer", "bytes", kAlways, "rank 0's peak resident memory so far (VmHWM)"},
      {"nonfinite_steps", kStep, "integer", "steps", kAlways,
       "steps of this run so far whose update was skipped for a NaN or Inf (`train.on_nonfinite`)"},
      {"time_collective_s", kStep, "number", "seconds", kAlways,
       "rank 0's time inside the models' collective calls: starts and waits of all-gathers and "
       "reduce-scatters, blocking all-reduces; G and D summed"},
      {"exposed_comm_s", kStep, "number", "seconds", kAlways,
       "the same figure as `time_collective_s`: communication not hidden behind compute "
       "(SyncBatchNorm's all-reduces and the votes are not in it)"},
      {"minor_faults", kStep, "integer", "faults", kAlways,
       "rank 0's minor page faults during the step (getrusage, all threads)"},
      {"system_s", kStep, "number", "seconds", kAlways, "rank 0's CPU time in the kernel during the step"},
      {"user_s", kStep, "number", "seconds", kAlways, "rank 0's CPU time in user space during the step"},
      {"time_offload_read_s", kStep, "number", "seconds", kAlways,
       "rank 0's reads of master shards from the offload tier for all-gathers (0 without offload)"},
      {"time_offload_grad_s", kStep, "number", "seconds", kAlways,
       "rank 0's gradient offload reads and writes outside the step (0 without gradient offload)"},
      {"time_optimizer_s", kStep, "number", "seconds", kAlways, "rank 0's optimizer updates, G and D summed"},
      {"time_optimizer_io_s", kStep, "number", "seconds", kAlways,
       "of `time_optimizer_s`, the offload tier's I/O (0 without optimizer offload)"},
      {"comm_bytes_world", kStep, "integer", "bytes", kAlways,
       "rank 0's collective volume on the world communicator (full size of each collective)"},
      {"comm_bytes_shard_group", kStep, "integer", "bytes", kAlways,
       "rank 0's collective volume inside the models' shard groups (HSDP)"},
      {"comm_bytes_replicate", kStep, "integer", "bytes", kAlways,
       "rank 0's collective volume across replica groups (HSDP's gradient all-reduce)"},
      {"comm_bytes_secondary", kStep, "integer", "bytes", kAlways,
       "rank 0's collective volume inside hpZ's secondary groups (`sharding.<model>.hpz_partition_size`)"},
      {"bytes_between_groups", kStep, "integer", "bytes", "`train.placement: split`",
       "images and their gradients sent between G's and D's ranks, all ranks summed"},
      {"bytes_between_groups_formula", kStep, "integer", "bytes", "`train.placement: split`",
       "what `bytes_between_groups` should be: image bytes x global batch x transfers"},
      {"idle_g_s", kStep, "number", "seconds", "`train.placement: split`",
       "time G's ranks waited for D's, averaged over G's ranks"},
      {"idle_d_s", kStep, "number", "seconds", "`train.placement: split`",
       "time D's ranks waited for G's, averaged over D's ranks"},
      {"busy_g_s", kStep, "number", "seconds", "`train.placement: split`", "time G's ranks computed"},
      {"busy_d_s", kStep, "number", "seconds", "`train.placement: split`", "time D's ranks computed"},
      {"r1", kStep, "number", "", "`train.r1_gamma` > 0",
       "R1 penalty of this step's D updates, before its weight (0 on steps without one)"},
      {"pl", kStep, "number", "", "`train.pl_weight` > 0, on steps with a path-length update",
       "path-length penalty mean((a - m)^2), before its weight"},
      {"pl_mean", kStep, "number", "", "`train.pl_weight` > 0",
       "running mean m of path lengths after the step, averaged over every rank"},
      {"r_t", kStep, "number", "", "steps whose D updates saw real images",
       "mean sign of D's logits on the (augmented) real images over every rank: ADA's r_t of this step"},
      {"ada_p", kStep, "number", "", "`augment.mode` not none", "ADA's augmentation probability p after the step"},
      {"ada_rt", kStep, "number", "", "`augment.mode` not none, after p's first adjustment",
       "the r_t that p's last adjustment used (mean over `augment.interval` steps)"},
      {"class_real", kStep, "number", "", "`train.aux_class_weight` > 0",
       "cross-entropy of D's class head on the real images (AC-GAN's class term)"},
      {"class_fake", kStep, "number", "", "`train.aux_class_weight` > 0",
       "cross-entropy of D's class head on G's images"},
      {"loss_l1", kStep, "number", "", "image-conditioned families (pix2pix)",
       "mean abs(G(A) - B) of G's pass, before its weight"},
      {"device_mem_used_bytes", kStep, "integer", "bytes", "`run.device: cuda`", "rank 0's GPU memory in use after the step"},
      {"device_mem_peak_allocated_bytes", kStep, "integer", "bytes", "`run.device: cuda`",
       "rank 0's peak of GPU bytes held by live tensors during the step"},

      {"step", kEval, "integer", "steps", kAlways, "steps done when the models were scored"},
      {"fid", kEval, "number", "", kAlways,
       "Frechet distance between the generated and the reference images' features", true},
      {"kid", kEval, "number", "", "KID computed (`eval.kid_subsets`, at least 2 samples)",
       "Kernel Inception Distance: mean unbiased MMD^2 over the subsets", true},
      {"kid_std", kEval, "number", "", "as `kid`", "KID's standard deviation over the subsets", true},
      {"precision", kEval, "number", "", "more than 3 samples", "improved precision, k = 3, in [0, 1]", true},
      {"recall", kEval, "number", "", "more than 3 samples", "improved recall, k = 3, in [0, 1]", true},
      {"is", kEval, "number", "", "`eval.features: torchscript` with logits", "Inception Score", true},
      {"is_std", kEval, "number", "", "as `is`", "the Inception Score's standard deviation over its splits", true},
      {"class_acc", kEval, "number", "", "conditional models with the classifier",
       "the classifier's accuracy on generated images against the labels they were generated for", true},
      {"class_fractions", kEval, "array of numbers", "", "`eval.features: classifier`",
       "fraction of generated images assigned to each class (sums to 1): mode coverage", true},
      {"l1", kEval, "number", "", "image-to-image families", "mean abs(G(A) - B) on the held-out pairs", true},
      {"psnr", kEval, "number", "dB", "image-to-image families", "PSNR of G(A) against B on the held-out pairs", true},
      {"ssim", kEval, "number", "", "image-to-image families", "SSIM of G(A) against B on the held-out pairs", true},
      {"eval_set", kEval, "string", "", "image-to-image families",
       "the held-out pairs scored: fashion-mnist-edges or synthetic-edges"},
      {"features", kEval, "string", "", kAlways,
       "the feature network: kind, description, file and weights hash"},
      {"pr_features", kEval, "string", "", "`eval.pr_feature_network` set", "the network of precision and recall"},
      {"kid_subset_size", kEval, "integer", "samples", kAlways, "samples per side in each KID subset (0: no KID)"},
      {"paper_comparable", kEval, "boolean", "", kAlways,
       "a published feature space, and at least 50,000 samples and reference images"},
      {"truncation", kEval, "number", "", "`eval.truncation` > 0", "the truncation of the `_trunc` scores"},
      {"eval_samples", kEval, "integer", "images", kAlways, "generated images per model scored (all ranks)"},
      {"eval_time_s", kEval, "number", "seconds", kAlways, "wall time of the evaluation on rank 0, every model"},
  };
  return fields;
}

namespace {

const MetricsField* find_field(std::string_view key, MetricsRecord kind) {
  for (const MetricsField& f : metrics_fields()) {
    if (f.record != kind) continue;
    if (f.name == key) return &f;
    if (!f.per_model || key.substr(0, f.name.size()) != f.name) continue;
    const std::string_view rest = key.substr(f.name.size());
    for (std::string_view s : kScoreSuffixes) {
      if (rest == s) return &f;
    }
  }
  return nullptr;
}

std::string with_suffixes(const MetricsField& f) {
  std::string s = "`" + std::string(f.name) + "`";
  if (f.per_model) {
    for (std::string_view x : kScoreSuffixes) s += ", `" + std::string(f.name) + std::string(x) + "`";
  }
  return s;
}

void table(std::ostringstream& md, MetricsRecord kind) {
  md << "| field | type | unit | written | meaning |\n|---|---|---|---|---|\n";
  for (const MetricsField& f : metrics_fields()) {
    if (f.record != kind) continue;
    md << "| " << with_suffixes(f) << " | " << f.type << " | " << f.unit << " | " << f.when << " | " << f.meaning
       << " |\n";
  }
}

}  // namespace

std::string metrics_reference_markdown() {
  std::ostringstream md;
  md << "# metrics.jsonl reference\n\n"
     << "<!-- Generated by `shardgan-train --metrics-reference` from the table the writer checks\n"
     << "     (src/train/metrics_record.cpp); do not edit by hand. The test docs fails when this page and\n"
     << "     the table disagree, and a run fails when it would write a field the table lacks. -->\n\n"
     << "Every run appends to `<run.dir>/metrics.jsonl` one JSON object per line, from rank 0. A **training\n"
     << "record** is written every `train.log_every` steps and at the last step; an **evaluation record**\n"
     << "every `train.eval_every` steps and at the end when `eval.enabled` is on. Training records carry\n"
     << "`loss_d`, evaluation records `fid`:\n\n"
     << "```python\n"
     << "import json\n"
     << "rows = [json.loads(line) for line in open(\"runs/fmnist-dcgan/metrics.jsonl\")]\n"
     << "train = [r for r in rows if \"loss_d\" in r]\n"
     << "evals = [r for r in rows if \"fid\" in r]\n"
     << "```\n\n"
     << "A resumed run appends to the same file, so a step can appear twice (the resumed run's\n"
     << "line is the later one). Losses and D's outputs are the same figure on every rank (reduced\n"
     << "over the ranks before they are logged); times, page faults, memory and collective bytes\n"
     << "are rank 0's. `memory.json` beside it holds every rank's peak memory and the pre-flight's\n"
     << "prediction ([models.md](models.md#memory-pre-flight)).\n\n"
     << "## Training records\n\n";
  table(md, MetricsRecord::kStep);
  md << "\n## Evaluation records\n\n"
     << "A score is written for G under its name, and with a suffix for the other models scored:\n"
     << "`_ema` for G's EMA (with `ema.enabled`), `_trunc` and `_ema_trunc` for the same models\n"
     << "on truncated latents (with `eval.truncation`). How each is computed: [fid.md](fid.md).\n\n";
  table(md, MetricsRecord::kEvaluation);
  return md.str();
}

std::vector<std::string> unlisted_metrics_fields(const nlohmann::json& record, MetricsRecord kind) {
  std::vector<std::string> out;
  for (const auto& item : record.items()) {
    if (!find_field(item.key(), kind)) out.push_back(item.key());
  }
  return out;
}

void append_metrics_record(const std::string& run_dir, const nlohmann::json& record, MetricsRecord kind) {
  const std::vector<std::string> unlisted = unlisted_metrics_fields(record, kind);
  if (!unlisted.empty()) {
    std::string names;
    for (const std::string& n : unlisted) names += (names.empty() ? "'" : ", '") + n + "'";
    throw std::logic_error("metrics.jsonl: the " +
                           std::string(kind == MetricsRecord::kStep ? "training" : "evaluation") +
                           " record has fields that docs/metrics.md does not list (" + names +
                           "): add them to metrics_fields() in src/train/metrics_record.cpp and regenerate "
                           "the page with `shardgan-train --metrics-reference > docs/metrics.md`");
  }
  std::ofstream(run_dir + "/metrics.jsonl", std::ios::app) << record.dump() << "\n";
}

}  // namespace shardgan
