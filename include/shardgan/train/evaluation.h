#pragma once
/// Sample quality during training and on checkpoints: FID, KID, precision/recall and (with
/// logits) IS between generated and real images in the feature space of a feature network
/// (eval/feature_network.h: a Fashion-MNIST classifier from `shardgan-fid train-classifier`,
/// or a TorchScript Inception-v3 from scripts/export_inception.py), and, with the classifier
/// and a conditional model, its accuracy on generated images against the labels they were
/// generated for. See docs/fid.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace shardgan {

class Communicator;
class ModelFamily;
class ShardedModel;
struct TrainConfig;

/// One evaluation of a generator.
struct EvalResult {
  double fid = 0;            ///< Frechet distance to the reference set's features
  double class_acc = -1;     ///< classifier accuracy on the generated images; -1 if unconditional
  int64_t samples = 0;       ///< generated images (all ranks together)
  double truncation = 0;     ///< the latents' truncation threshold (0: none)
  /// Fraction of the generated images the classifier assigns to each of its K classes
  /// (sums to 1): mode coverage, for unconditional models too (Fashion-MNIST's are 0.1
  /// each); empty with a TorchScript network.
  std::vector<double> class_fractions;
  /// Image-to-image families: G(A) against B on the held-out pairs (eval/image_quality.h),
  /// averaged over the samples; -1 otherwise.
  double l1 = -1, psnr = -1, ssim = -1;
  double time_s = 0;         ///< wall time of the evaluation on this rank (seconds)
  /// Image-to-image families: the held-out pairs scored (image_eval_set), written to the
  /// metrics record as `eval_set`; empty otherwise.
  std::string eval_set;
  /// KID (feature_metrics.h: unbiased MMD², cubic kernel) between the reference and the
  /// generated features: mean and population std over `kid_subsets` subsets of
  /// `kid_subset_size` samples per side (min(eval.kid_subset_size, samples, reference
  /// images); kid_subsets 0 when fewer than 2).
  double kid = 0, kid_std = 0;
  int64_t kid_subsets = 0, kid_subset_size = 0;
  /// Improved precision and recall, k = 3, in [0, 1]; -1 with 3 samples or fewer.
  double precision = -1, recall = -1;
  /// Inception Score over min(10, samples) splits (torchscript networks with logits only);
  /// -1 otherwise.
  double inception_score = -1, inception_score_std = -1;
  /// The feature network: kind, description, file and weights hash.
  std::string features;
  /// The network of precision and recall when eval.pr_feature_network names one (kind,
  /// description, file and weights hash, like `features`); empty when they are on `features`.
  std::string pr_features;
  /// The network's weights are a published feature space (its manifest says comparable:
  /// pytorch-fid) and both the samples and the reference images number at least
  /// kPaperSamples: FID is biased by the sample count, so papers' 50k figures need 50k.
  bool paper_comparable = false;
};

/// Samples (and reference images) below which a record is tagged paper_comparable: false.
inline constexpr int64_t kPaperSamples = 50000;

/// Local. The held-out pairs an image-to-image family's evaluation translates and scores:
/// "fashion-mnist-edges" (the Sobel edge maps of Fashion-MNIST's t10k images, from data.path
/// for data.source fashion-mnist and from eval.reference for hdf5 and paired) or
/// "synthetic-edges" (data.source synthetic: held_out_images' synthetic images); "" for a
/// family that is not image-to-image.
std::string image_eval_set(const TrainConfig& cfg);

/// Local. Why evaluating `cfg`'s image-to-image model scores another task than the one it
/// trains on, or "" when it does not: data.source paired (a folder of A|B images), or hdf5
/// whose file is not Fashion-MNIST's edge pairs (`shardgan-data convert --paired` of
/// Fashion-MNIST: 1x32x32 images B, a 1-channel A and Fashion-MNIST's class names), scored on
/// Fashion-MNIST's edges all the same. "" for other families and sources. Opens the hdf5
/// file's header (throws DataError naming it when it cannot be read).
std::string image_eval_mismatch(const TrainConfig& cfg);

/// Writes `r`'s scores into `j` under the keys of metrics.jsonl's evaluation records, each
/// followed by `suffix` ("" for G, "_ema", "_trunc", "_ema_trunc"): fid, kid and kid_std,
/// precision and recall, is and is_std (when computed), class_acc (when conditional), l1,
/// psnr and ssim (image-to-image), class_fractions (classifier); and, without a suffix (the
/// same for every model of a record), eval_set (image-to-image), features, pr_features
/// (with eval.pr_feature_network), kid_subset_size and paper_comparable. Local.
void put_scores(nlohmann::json& j, const EvalResult& r, const std::string& suffix = "");

/// Local. The reference images of an evaluation, float32 CPU [N, C, H, W] in [-1, 1]: at
/// most `max_images`, at indices floor(i size / max_images) (evenly spread; all when
/// max_images >= size), of the `split` ("t10k" or "train") of the Fashion-MNIST folder
/// `source`, or of the images of the HDF5 file `source` (`shardgan-data convert`; `split`
/// unused). Throws DataError naming the file or folder when it cannot be read.
at::Tensor reference_images(const std::string& source, int64_t max_images, const std::string& split = "t10k");

class Evaluator {
 public:
  /// Collective (one all-gather of the reference moments and one of the reference
  /// features, and one more with cfg.eval_pr_feature_network). Every rank loads the
  /// feature network of cfg.eval_features
  /// (eval/feature_network.h: the classifier file cfg.eval_classifier, or the TorchScript
  /// file cfg.eval_feature_network) and featurizes its contiguous share of the reference
  /// images: at most cfg.eval_reference_samples, evenly spaced, of the t10k split of the
  /// Fashion-MNIST folder cfg.eval_reference, or of the images of the HDF5 file
  /// cfg.eval_reference (`shardgan-data convert`). Every rank keeps all reference features
  /// (float64 [N_ref, F]: 164 MB at 10,000 x 2048) for KID and precision/recall. With
  /// cfg.eval_pr_feature_network (a TorchScript file: a manifest, or NVIDIA's vgg16.pt
  /// interface) every rank also loads that network and featurizes its share of the same
  /// reference images with it, every time (eval.reference_cache holds the main network's
  /// features only): precision and recall then compare those features. Throws
  /// ConfigError naming the key and the file if a network cannot be loaded or cannot take
  /// the family's or the reference's images (FeatureNetwork::check_images), or if an
  /// image-to-image family is given an HDF5 reference. With the classifier, a conditional
  /// family with its 10 classes also gets class accuracy. An image-to-image family
  /// whose evaluation scores another task than its training data (image_eval_mismatch)
  /// warns once, on rank 0 of `comm` (not in the memory probe's stand-in world, backend
  /// "shadow"). `comm` and `family` must outlive this object.
  Evaluator(const TrainConfig& cfg, Communicator& comm, const ModelFamily& family);
  ~Evaluator();

  /// Collective: every rank runs the same number of G forwards (ZeRO-3 gathers). Draws
  /// cfg.eval_samples latents (and labels k mod num_classes for a conditional family) from
  /// a generator seeded with cfg.seed + 5 (truncated at `truncation` when above 0:
  /// ModelFamily::sample_truncated_latents, which throws std::invalid_argument for a family
  /// without Gaussian latents), the same every time, so that evaluations at
  /// different steps and world sizes see the same inputs; each rank generates its
  /// contiguous share in chunks of at most 64, in train mode as the sampler does, restoring
  /// every buffer afterwards (training is unchanged). An image-to-image family translates the
  /// edge maps of the first cfg.eval_samples (at most 10000) held-out images
  /// (held_out_images) and is scored against them too. With eval.pr_feature_network the
  /// same images also go through that network. FID comes from float64 moments
  /// merged over ranks in rank order (one all-gather); the features themselves are gathered
  /// (one all-gather, two with logits), and rank 0 computes KID over eval.kid_subsets seeded
  /// subsets (seed 0), precision/recall (k = 3) against the reference features and, for a
  /// TorchScript network with logits, IS over 10 splits, then broadcasts them: the other
  /// ranks wait in that broadcast (dist.timeout_s) while it computes. The result is the same
  /// on every rank.
  /// With `identity` (image-to-image families only; std::invalid_argument otherwise), the
  /// input images A themselves are scored in place of G(A): the B ~ A baseline.
  EvalResult evaluate(ShardedModel& g, bool identity = false, double truncation = 0);

 private:
  /// Collective: the reference moments and features of `real` (each rank featurizes its
  /// contiguous share; one all-gather each).
  void compute_reference(const at::Tensor& real);
  /// Collective: gathers the generated features (and logits, and `pr_features` of
  /// eval.pr_feature_network when defined) of every rank in rank order; rank 0 computes
  /// KID, precision/recall and IS into `res` and broadcasts them.
  void feature_metrics(EvalResult& res, const at::Tensor& features, const at::Tensor& logits,
                       const at::Tensor& pr_features, int64_t W);
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace shardgan
