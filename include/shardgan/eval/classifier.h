#pragma once
/// A small CNN classifier whose penultimate layer is the feature space of shardgan's default
/// quality metric (FID, KID and precision/recall on these features instead of
/// Inception-v3's; see frechet.h and docs/fid.md): Fashion-MNIST's at 1x32x32 by default, or
/// one trained on any labelled dataset (C x S x S, K classes). Figures on it are comparable
/// only with figures on the same file, never with papers. Everything here is local (no
/// collectives) and runs on the CPU: the classifier's parameters are float32 CPU tensors,
/// and inputs on another device or of another float dtype are copied to float32 CPU.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace shardgan::eval {

/// Width of the feature vector (the penultimate layer: fc1's 128 ReLU outputs).
inline constexpr int64_t kClassifierFeatureDim = 128;
/// Number of classes of the default (Fashion-MNIST's ten).
inline constexpr int64_t kClassifierClasses = 10;

/// The images a classifier takes and the classes it tells apart.
struct ClassifierShape {
  int64_t channels = 1;   ///< 1 or 3
  int64_t size = 32;      ///< S, the images' height and width: a power of two from 32 to 1024
  int64_t classes = kClassifierClasses;  ///< K >= 2
  /// "CxSxS", the file's image_shape attribute.
  std::string image_shape() const;
};
/// The root attribute "format" of a classifier file, and its "version".
inline constexpr const char* kClassifierFormat = "shardgan-fid-classifier";
inline constexpr int64_t kClassifierVersion = 1;

/// The CNN, for images [B, C, S, S] in [-1, 1] (data/images.h's load_fashion_mnist gives
/// [B, 1, 32, 32]):
///   conv1 4x4 stride 2 pad 1, C->32 + bn1 + ReLU       -> [B, 32, S/2, S/2]
///   conv2 3x3 stride 2 pad 1, 32->64 + bn2 + ReLU      -> [B, 64, S/4, S/4]
///   conv3, conv4, ... (S > 32 only): 3x3 stride 2 pad 1, 64->64 + bn3, bn4, ... + ReLU,
///                                                        until the map is 8x8
///   fc1: 8x8 conv 64->128 (a fully connected layer over the 64x8x8 map) + ReLU
///                                                       -> features [B, 128]
///   fc2: linear 128->K                                  -> logits [B, K]
/// At 1x32x32 with 10 classes (the default): strided convolutions instead of max pooling,
/// and fc1 as a convolution, because both run in oneDNN, while linear layers go through the
/// system BLAS: about 1.8 M multiply-adds per image, 544,938 parameters (float32, CPU) and
/// three buffers per BatchNorm (running_mean, running_var: float32; num_batches_tracked:
/// int64). Parameters start from torch's default initialization (global generator);
/// train_classifier re-initializes them from its seed.
class ClassifierImpl : public torch::nn::Module {
 public:
  /// Throws std::invalid_argument naming the field if `shape` is out of range.
  explicit ClassifierImpl(ClassifierShape shape = {});
  /// Logits [B, K], float32, for x [B, C, S, S] float32 CPU. Uses batch statistics in
  /// train mode and running statistics in eval mode (BatchNorm). Does not check the shape.
  at::Tensor forward(const at::Tensor& x);
  /// Features [B, 128], float32, >= 0 (post-ReLU): fc1's output, the input of fc2.
  at::Tensor features(const at::Tensor& x);
  const ClassifierShape& shape() const { return shape_; }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  std::vector<torch::nn::Conv2d> extra_convs;  ///< conv3, conv4, ... (S > 32)
  std::vector<torch::nn::BatchNorm2d> extra_bns;  ///< bn3, bn4, ...
  torch::nn::Conv2d fc1{nullptr};
  torch::nn::Linear fc2{nullptr};

 private:
  ClassifierShape shape_;
};
TORCH_MODULE(Classifier);

/// A classifier file that is missing, not a classifier file, or incomplete. The message
/// names the file and what is wrong, and says how to make a new one.
class ClassifierFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ClassifierTrainOptions {
  int64_t epochs = 3;    ///< passes over the training set
  int64_t batch = 128;   ///< images per Adam step (the last partial batch is used too)
  double lr = 1e-3;      ///< Adam learning rate of the first epoch (betas 0.9, 0.999)
  double lr_decay = 0.5; ///< the learning rate is multiplied by this after each epoch
  uint64_t seed = 1;     ///< parameter initialization and per-epoch shuffling
  int64_t eval_batch = 256;   ///< images per forward pass when measuring test accuracy
};

struct ClassifierTrainResult {
  double test_accuracy = 0;   ///< fraction of test images classified correctly, in [0, 1]
  double train_loss = 0;      ///< mean cross-entropy over the last epoch's batches
  double train_time_s = 0;    ///< wall time of the training loop (excludes the test pass)
  int64_t epochs = 0;
};

/// Trains `model` from scratch with Adam and cross-entropy, then measures its accuracy on
/// the test set (eval mode). Images: float CPU [N, C, S, S] of the model's shape() in
/// [-1, 1] (converted to float32); labels: int64 [N] in [0, K). Seeds torch's global CPU generator with
/// `opt.seed` (torch::manual_seed) and re-initializes every parameter and BatchNorm buffer
/// from it, so the result depends only on the seed, the data and torch's thread count.
/// Logs one line per epoch (loss, time) and the accuracy with spdlog at info level.
/// Leaves `model` in eval mode. Throws std::invalid_argument naming the tensor if a shape,
/// a label count or an option (epochs, batch, lr, lr_decay <= 0) is wrong.
ClassifierTrainResult train_classifier(Classifier& model, const at::Tensor& train_images,
                                       const at::Tensor& train_labels,
                                       const at::Tensor& test_images,
                                       const at::Tensor& test_labels,
                                       const ClassifierTrainOptions& opt = {});

/// What a classifier file records besides the weights (its root attributes).
struct ClassifierInfo {
  double test_accuracy = 0;  ///< accuracy on the held-out test images measured after training
  int64_t epochs = 0;        ///< training epochs
  int64_t seed = 0;          ///< training seed
  double train_time_s = 0;   ///< training wall time
  ClassifierShape shape;     ///< filled by load_classifier from image_shape and num_classes
};

/// Writes `model` to the HDF5 file `path`: one dataset per named parameter and buffer
/// (named by its key in named_parameters()/named_buffers(), e.g. "conv1.weight",
/// "bn1.running_mean"; float32, or int64 for num_batches_tracked), and root attributes
/// format = "shardgan-fid-classifier", version = 1, image_shape = "CxSxS" (model->shape()),
/// feature_dim = 128, num_classes = K, and `info`'s fields. Atomic: writes `path`.tmp,
/// fsyncs it and renames it over `path`. Throws h5::H5Error or std::filesystem's
/// filesystem_error naming the file if it cannot be written.
void save_classifier(Classifier& model, const std::string& path, const ClassifierInfo& info);

/// Reads a classifier written by save_classifier into a new module in eval mode; fills
/// `info` if given. Throws ClassifierFileError naming `path` if it is missing or not HDF5,
/// lacks format "shardgan-fid-classifier", has another version or feature_dim, an
/// image_shape or num_classes out of range, or lacks a dataset of the module (built for its
/// image_shape and num_classes) or holds one of another shape, or when the forked child that reads
/// the file first (h5::probe_isolated) finds it unreadable, crashes in libhdf5 or passes
/// its deadline; every message ends with
/// "run shardgan-fid train-classifier -o PATH" to make a valid one.
Classifier load_classifier(const std::string& path, ClassifierInfo* info = nullptr);

/// Features of `images` (any float dtype, any device; copied to float32 CPU), [N, C, S, S] of
/// model->shape(), as float64 CPU [N, 128], computed in eval mode without autograd, `batch` images per
/// forward pass (the result does not depend on `batch` beyond float32 summation order).
/// Restores the module's train/eval mode afterwards. N = 0 gives [0, 128]. Throws
/// std::invalid_argument naming the shape if `images` is not [N, C, S, S] or not a float
/// dtype, or if batch < 1.
at::Tensor extract_features(Classifier& model, const at::Tensor& images, int64_t batch = 256);

/// Predicted labels (argmax of the logits), int64 CPU [N], for `images` as in
/// extract_features (same checks, same throws, eval mode).
at::Tensor classify(Classifier& model, const at::Tensor& images, int64_t batch = 256);

}  // namespace shardgan::eval
