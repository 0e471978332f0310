#pragma once
/// The network whose features the sample-quality metrics compare (FID, KID, precision and
/// recall; frechet.h, feature_metrics.h) and whose logits give the Inception Score: either
/// shardgan's Fashion-MNIST classifier (classifier.h) or a TorchScript file the user
/// supplies, such as pytorch-fid's FID Inception-v3 exported by scripts/export_inception.py.
/// See docs/fid.md. Everything here is local (no collectives) and runs on the CPU in float32;
/// features and logits come back as float64 CPU tensors.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

namespace shardgan::eval {

/// A feature-network file that cannot be used: missing, not TorchScript, without a manifest,
/// a manifest that does not match the module, or images the network cannot take. The
/// message names the file and what to do.
class FeatureNetworkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The name of the manifest inside a TorchScript archive (torch.jit.save's _extra_files).
inline constexpr const char* kFeatureManifestName = "shardgan_manifest.json";
/// The manifest's "format" and "version".
inline constexpr const char* kFeatureManifestFormat = "shardgan-feature-network";
inline constexpr int64_t kFeatureManifestVersion = 1;

/// What a network's module expects, from its manifest's "input" object. shardgan's images
/// are float in [-1, 1], [B, C, H, W] with C 1 or 3; before the module runs, they are
///  1. mapped linearly from [-1, 1] onto [range_min, range_max]; or, with `quantize`
///     "uint8", turned into uint8 pixels as StyleGAN2-ADA's metrics do
///     (metric_utils.py: `(x * 127.5 + 128).clamp(0, 255).to(torch.uint8)`, a truncation,
///     so round-half-up of x * 127.5 + 127.5), range [0, 255];
///  2. repeated to 3 channels when C = 1 and `channels` = 3 (greyscale as RGB, as
///     pytorch-fid, clean-fid and StyleGAN2-ADA treat grey images);
///  3. resized to height x width when `resize` is "bilinear": torch's bilinear
///     interpolation with align_corners false and no antialiasing
///     (torch.nn.functional.interpolate's default, what pytorch-fid's InceptionV3 wrapper
///     applies); with `resize` "none" the images must already have that size; with
///     "module" they go in at their own size and the module resizes them itself
///     (height x width is then only the size of the load-time probe image).
/// The steps are applied in this order, in float32, so a Python caller that does the same
/// gets the same module input up to float32 rounding.
struct InputContract {
  double range_min = -1.0;  ///< the value range the module expects
  double range_max = 1.0;
  int64_t channels = 1;     ///< 1 or 3
  int64_t height = 32;      ///< the module's input size (pixels)
  int64_t width = 32;
  std::string resize = "none";    ///< "none", "bilinear" or "module"
  std::string quantize = "none";  ///< "none" (float32 input) or "uint8" (uint8 input, range [0, 255])
};

/// One batch through a feature network.
struct FeatureBatch {
  at::Tensor features;  ///< float64 CPU [B, F]
  at::Tensor logits;    ///< float64 CPU [B, K]; undefined when the network has none
};

/// A feature network. Implementations: the classifier (load_feature_network("classifier",
/// ...)) and a TorchScript module (load_feature_network("torchscript", ...)).
class FeatureNetwork {
 public:
  virtual ~FeatureNetwork() = default;
  /// "classifier" or "torchscript".
  virtual std::string kind() const = 0;
  /// The file it was loaded from.
  virtual const std::string& path() const = 0;
  /// What the file holds, for records and messages: the manifest's "architecture" and
  /// "weights" ("pytorch-fid-inception-v3, random weights (seed 1)"), or the classifier's.
  virtual std::string description() const = 0;
  /// The identity of the network for statistics caches: xxh3-64 (16 hex digits) of its
  /// parameters' and buffers' bytes in the order of their names, the value the manifest
  /// records.
  virtual std::string hash() const = 0;
  /// True only for a manifest whose "comparable" names a published feature space
  /// ("pytorch-fid": the pretrained FID Inception-v3 weights); figures on any other
  /// network are comparable only with figures on the same file.
  virtual bool comparable_with_papers() const = 0;
  /// F, the width of the features.
  virtual int64_t feature_dim() const = 0;
  /// K, the number of logits; 0 when the network gives none (no Inception Score).
  virtual int64_t num_logits() const = 0;
  /// The input contract (the classifier's: [-1, 1], 1 channel, 32 x 32, no resize).
  virtual const InputContract& input() const = 0;
  /// Throws FeatureNetworkError naming the file and the shape when images of C x H x W
  /// cannot be fed under input(): C not 1 or 3, C = 3 into a 1-channel network, or, with
  /// resize "none", H x W other than the contract's.
  void check_images(int64_t channels, int64_t height, int64_t width) const;
  /// Features (and logits) of `images` [N, C, H, W] in [-1, 1] (any float dtype and device;
  /// computed in float32 on the CPU, eval mode, no autograd), `batch` images per module
  /// call; N = 0 gives [0, F] (and [0, K]). The result does not depend on `batch` beyond
  /// float32 summation order inside the module. Throws FeatureNetworkError as
  /// check_images does, and std::invalid_argument if batch < 1 or the tensor is not 4-D float.
  FeatureBatch run(const at::Tensor& images, int64_t batch = 64);

 protected:
  /// One module call on images already adapted to input() ([B, channels, height, width]
  /// float32 CPU; uint8 with quantize "uint8"; any height x width with resize "module").
  /// Implementations check the output shapes.
  virtual FeatureBatch forward(const at::Tensor& adapted) = 0;
};

/// Loads a feature network. `kind` "classifier": a file from `shardgan-fid train-classifier`
/// (features: the 128-d penultimate layer; logits: its 10 classes). `kind` "torchscript": a
/// TorchScript archive (torch.jit.save), either
///  - holding the manifest kFeatureManifestName, a JSON object with format
///    "shardgan-feature-network", version 1, "architecture", "weights", "weights_xxh3"
///    (xxh3-64 hex of the parameters' and buffers' bytes, sorted by name), "input"
///    ({"range": [lo, hi], "channels": 1|3, "size": [H, W], "resize": "none"|"bilinear"}),
///    "outputs" ({"features": F, "logits": K or 0}) and optionally "comparable"
///    ("pytorch-fid" for the pretrained weights). The module's forward takes the adapted
///    images [B, C, H, W] float32 and returns the features [B, F], or a tuple (features
///    [B, F], logits [B, K]);
///  - or without a manifest, when its forward has StyleGAN2-ADA's detector interface
///    `forward(img, return_features: bool, use_fp16: bool, no_output_bias: bool)`: NVIDIA's
///    `inception-2015-12-05.pt` (stylegan2-ada-pytorch's metrics/, also clean-fid's), used as
///    StyleGAN2-ADA does. Its input is uint8 [B, 3, H, W] at any size (it resizes to 299
///    itself); features [B, F] come from `return_features=True`, and the logits [B, K] are
///    features x output.weight^T (no bias), computed here in float64, whose softmax is what
///    `no_output_bias=True` returns for the Inception Score; K = 0 without an `output`
///    submodule. F comes from the probe image. Such a file is not marked comparable with
///    papers (its weights' hash is not pinned here); records carry its hash();
///  - or without a manifest, when its forward is `forward(img, ...)` with `resize_images`,
///    `return_lpips` and `return_features` among its arguments: NVIDIA's `vgg16.pt`, the
///    VGG16 of StyleGAN2-ADA's precision/recall (metrics/precision_recall.py). It is called
///    as there: uint8 [B, 3, H, W] at any size, return_features=True and the module's own
///    resize (resize_images left at its default); features [B, F], no logits (K = 0).
/// On load the module is put in eval mode, its parameters are hashed and one image of the
/// contract's shape is run through it. Throws FeatureNetworkError naming `path` when the file
/// is missing or not TorchScript, has neither a manifest nor the detector interface, has an
/// invalid manifest, when its parameters are not float32 or their hash differs from the
/// manifest's, when the probe image fails in the module, or when the probe's outputs have
/// other widths than the manifest's; each message says how to make a valid file
/// (scripts/export_inception.py). Throws std::invalid_argument for another `kind`.
std::unique_ptr<FeatureNetwork> load_feature_network(const std::string& kind, const std::string& path);

}  // namespace shardgan::eval
