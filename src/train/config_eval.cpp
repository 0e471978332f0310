// The eval section of the training configuration (config_sections.h), with the train.*
// keys that schedule evaluations.
#include "shardgan/models/family.h"
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_eval(Reader& r, TrainConfig& c) {
  c.eval_enabled = r.get<bool>("eval.enabled", c.eval_enabled,
      "evaluate G (and its EMA): FID, KID, precision/recall, and IS or class accuracy where the feature "
      "network gives them (eval.features; docs/fid.md)");
  c.eval_every = r.get<int64_t>("train.eval_every", c.eval_every,
      "steps between evaluations (0: only at the end, if eval.enabled)");
  require(c.eval_every >= 0, r, "train.eval_every", "must be >= 0 (0 = only at the end)");
  c.eval_samples = r.get<int64_t>("train.eval_samples", c.eval_samples,
      "generated images per evaluation, split over ranks");
  require(c.eval_samples >= 2 && c.eval_samples <= 10000000, r, "train.eval_samples", "must be 2 to 1e7");
  c.eval_classifier = r.get<std::string>("eval.classifier", c.eval_classifier,
      "the classifier file from `shardgan-fid train-classifier`");
  c.eval_reference = r.get<std::string>("eval.reference", c.eval_reference,
      "the real images: a Fashion-MNIST folder (its t10k split) or an HDF5 file from `shardgan-data convert`");
  c.eval_reference_samples = r.get<int64_t>("eval.reference_samples", c.eval_reference_samples,
      "at most this many reference images are featurized, evenly spaced over the reference set");
  require(c.eval_reference_samples >= 2 && c.eval_reference_samples <= 10000000, r, "eval.reference_samples",
          "must be 2 to 1e7");
  c.eval_features = r.get<std::string>("eval.features", c.eval_features,
      "feature network of FID, KID and precision/recall: classifier (eval.classifier) or torchscript "
      "(eval.feature_network, e.g. Inception-v3 from scripts/export_inception.py)");
  require(c.eval_features == "classifier" || c.eval_features == "torchscript", r, "eval.features",
          "must be classifier or torchscript");
  c.eval_feature_network = r.get<std::string>("eval.feature_network", c.eval_feature_network,
      "TorchScript feature network with a shardgan manifest (scripts/export_inception.py; docs/fid.md)");
  require(c.eval_features != "torchscript" || !c.eval_feature_network.empty(), r, "eval.feature_network",
          "must name a file when eval.features is torchscript");
  r.warn_if_ignored(c.eval_features != "torchscript", "eval.feature_network",
                    "has no effect with eval.features: classifier");
  r.warn_if_ignored(c.eval_features != "classifier", "eval.classifier",
                    "has no effect with eval.features: torchscript (no class accuracy is computed)");
  c.eval_pr_feature_network = r.get<std::string>("eval.pr_feature_network", c.eval_pr_feature_network,
      "a second TorchScript network for precision and recall alone, as StyleGAN2-ADA's pr50k3 uses VGG16 "
      "(scripts/export_vgg16.py, or NVIDIA's vgg16.pt); FID, KID and IS stay on eval.features; empty: "
      "precision/recall on eval.features too");
  c.eval_reference_cache = r.get<std::string>("eval.reference_cache", c.eval_reference_cache,
      "HDF5 cache of the reference features (`shardgan-fid stats`): written when missing, reused when its "
      "network and image hashes match, refused when they do not");
  c.eval_kid_subsets = r.get<int64_t>("eval.kid_subsets", c.eval_kid_subsets,
      "KID is averaged over this many random subsets (Binkowski et al. 2018; StyleGAN2-ADA: 100)");
  require(c.eval_kid_subsets >= 1 && c.eval_kid_subsets <= 100000, r, "eval.kid_subsets", "must be 1 to 1e5");
  c.eval_kid_subset_size = r.get<int64_t>("eval.kid_subset_size", c.eval_kid_subset_size,
      "samples per KID subset and side, at most (fewer when an evaluation has fewer samples)");
  require(c.eval_kid_subset_size >= 2, r, "eval.kid_subset_size", "must be >= 2");
  c.eval_truncation = r.get<double>("eval.truncation", c.eval_truncation,
      "evaluations also score G and its EMA on truncated latents: |z| above this redrawn (BigGAN's "
      "truncation trick, Brock et al. 2019, section 3.1: fidelity for variety), or for model.arch stylegan2 "
      "the truncation psi in W (0: off)");
  require(c.eval_truncation == 0 || c.eval_truncation >= 0.05, r, "eval.truncation",
          "must be 0 (off) or at least 0.05");
  require(c.eval_truncation == 0 || c.family->truncation_applies(), r, "eval.truncation",
          "must be 0 (off) for model.arch pix2pix, whose latents are dropout seeds, not Gaussian");
  c.eval_timeout_s = r.get<double>("eval.timeout_s", c.eval_timeout_s,
      "train.placement split: how long D's ranks wait for G's ranks to finish an evaluation or a sample "
      "grid, beyond dist.timeout_s (seconds)");
  require(c.eval_timeout_s >= 0 && c.eval_timeout_s <= 1e9, r, "eval.timeout_s", "must be 0 to 1e9 (seconds)");
  r.warn_if_ignored(c.placement != "split", "eval.timeout_s",
                    "has no effect with train.placement shared: every rank evaluates and writes the samples");
}

}  // namespace shardgan::config_sections
