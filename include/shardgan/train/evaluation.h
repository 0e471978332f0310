#pragma once
/// Sample quality during training and on checkpoints: the Frechet distance between
/// generated and real images in the feature space of a Fashion-MNIST classifier
/// (src/eval/, `shardgan-fid train-classifier`), and, for conditional models, the
/// classifier's accuracy on generated images against the labels they were generated for.
/// See docs/fid.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
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
  /// Fraction of the generated images the classifier assigns to each of its 10 classes
  /// (sums to 1): mode coverage, for unconditional models too (Fashion-MNIST's are 0.1 each).
  std::vector<double> class_fractions;
  /// Image-to-image families: G(A) against B on the held-out pairs (eval/image_quality.h),
  /// averaged over the samples; -1 otherwise.
  double l1 = -1, psnr = -1, ssim = -1;
  double time_s = 0;         ///< wall time of the evaluation on this rank (seconds)
  /// Image-to-image families: the held-out pairs scored (image_eval_set), written to the
  /// metrics record as `eval_set`; empty otherwise.
  std::string eval_set;
};

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
/// followed by `suffix` ("" for G, "_ema", "_trunc", "_ema_trunc"): fid, class_acc (when
/// conditional), l1, psnr and ssim (image-to-image), class_fractions; and, image-to-image,
/// eval_set without a suffix (the same for every model of a record). Local.
void put_scores(nlohmann::json& j, const EvalResult& r, const std::string& suffix = "");

class Evaluator {
 public:
  /// Collective (one all-reduce of the reference moments). Every rank loads the classifier
  /// from cfg.eval_classifier (an error naming the file and `shardgan-fid train-classifier`
  /// if missing) and featurizes its share of the reference images: the t10k split (10,000
  /// images) of the Fashion-MNIST folder cfg.eval_reference. Throws ConfigError if the
  /// family's images are not 1x32x32 (the classifier's input). An image-to-image family
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
  /// (held_out_images) and is scored against them too. Features are summed over ranks (one
  /// all-reduce of float64 moments). The result is the same on every rank.
  /// With `identity` (image-to-image families only; std::invalid_argument otherwise), the
  /// input images A themselves are scored in place of G(A): the B ~ A baseline.
  EvalResult evaluate(ShardedModel& g, bool identity = false, double truncation = 0);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace shardgan
