// The eval section of the training configuration (config_sections.h), with the train.*
// keys that schedule evaluations.
#include "shardgan/models/family.h"
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_eval(Reader& r, TrainConfig& c) {
  c.eval_enabled = r.get<bool>("eval.enabled", c.eval_enabled,
      "compute FID and class accuracy (needs eval.classifier)");
  c.eval_every = r.get<int64_t>("train.eval_every", c.eval_every,
      "steps between evaluations (0: only at the end, if eval.enabled)");
  require(c.eval_every >= 0, r, "train.eval_every", "must be >= 0 (0 = only at the end)");
  c.eval_samples = r.get<int64_t>("train.eval_samples", c.eval_samples,
      "generated images per evaluation, split over ranks");
  require(c.eval_samples >= 2 && c.eval_samples <= 10000000, r, "train.eval_samples", "must be 2 to 1e7");
  c.eval_classifier = r.get<std::string>("eval.classifier", c.eval_classifier,
      "the classifier file from `shardgan-fid train-classifier`");
  c.eval_reference = r.get<std::string>("eval.reference", c.eval_reference,
      "Fashion-MNIST folder whose t10k split gives the real feature statistics");
  c.eval_truncation = r.get<double>("eval.truncation", c.eval_truncation,
      "evaluations also score G and its EMA on latents with |z| above this redrawn (BigGAN's "
      "truncation trick, Brock et al. 2019, section 3.1: fidelity for variety; 0: off)");
  require(c.eval_truncation == 0 || c.eval_truncation >= 0.05, r, "eval.truncation",
          "must be 0 (off) or at least 0.05");
  require(c.eval_truncation == 0 || c.family->gaussian_latents(), r, "eval.truncation",
          "must be 0 (off) for model.arch pix2pix, whose latents are dropout seeds, not Gaussian");
  c.eval_timeout_s = r.get<double>("eval.timeout_s", c.eval_timeout_s,
      "train.placement split: how long D's ranks wait for G's ranks to finish an evaluation or a sample "
      "grid, beyond dist.timeout_s (seconds)");
  require(c.eval_timeout_s >= 0 && c.eval_timeout_s <= 1e9, r, "eval.timeout_s", "must be 0 to 1e9 (seconds)");
  r.warn_if_ignored(c.placement != "split", "eval.timeout_s",
                    "has no effect with train.placement shared: every rank evaluates and writes the samples");
}

}  // namespace shardgan::config_sections
