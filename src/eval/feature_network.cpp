// Feature networks (feature_network.h): the input adaptation shared by every network, the
// classifier as a feature network, and the loader that picks the implementation.
#include "shardgan/eval/feature_network.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include <torch/torch.h>
#include <xxhash.h>

#include "eval/network_hash.h"
#include "eval/torchscript_network.h"
#include "shardgan/eval/classifier.h"
#include "shardgan/util/test_control.h"

namespace shardgan::eval {

std::string weights_xxh3(const std::map<std::string, at::Tensor>& tensors) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.detach().to(at::kCPU).contiguous();
    XXH3_64bits_update(state, c.data_ptr(), c.numel() * c.element_size());
  }
  const unsigned long long h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", h);
  return hex;
}

void FeatureNetwork::check_images(int64_t channels, int64_t height, int64_t width) const {
  const InputContract& in = input();
  const std::string shape = std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width);
  const std::string contract = std::to_string(in.channels) + "x" + std::to_string(in.height) + "x" +
                               std::to_string(in.width) + " (resize " + in.resize + ")";
  if (channels != 1 && channels != 3) {
    throw FeatureNetworkError(path() + ": images of " + shape + " cannot be scored: a feature network takes 1 or 3 "
                              "channels");
  }
  if (channels == 3 && in.channels == 1) {
    throw FeatureNetworkError(path() + ": images of " + shape + " are colour, but the network takes grey images " +
                              contract + "; use a network made for colour images (scripts/export_inception.py)");
  }
  if (in.resize == "none" && (height != in.height || width != in.width)) {
    throw FeatureNetworkError(path() + ": images of " + shape + " do not have the network's input size " + contract +
                              ", and its manifest allows no resize; use a network for this size, or one whose "
                              "manifest says resize: bilinear");
  }
}

FeatureBatch FeatureNetwork::run(const at::Tensor& images, int64_t batch) {
  if (batch < 1) throw std::invalid_argument("FeatureNetwork::run: batch must be >= 1");
  if (images.dim() != 4 || !at::isFloatingType(images.scalar_type())) {
    throw std::invalid_argument("FeatureNetwork::run: images must be a float [N, C, H, W] tensor, got " +
                                std::to_string(images.dim()) + "-D");
  }
  check_images(images.size(1), images.size(2), images.size(3));
  const InputContract& in = input();
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> feats, logits;
  const int64_t n = images.size(0);
  for (int64_t off = 0; off < n; off += batch) {
    const int64_t b = std::min(batch, n - off);
    at::Tensor x = images.narrow(0, off, b).to(at::kCPU, at::kFloat);
    // Test control "feature_range": skip the range mapping, or feed uint8 pixels as
    // x * 127.5 + 127.5 without the rounding (ctest torchscript_metrics_control and
    // torchscript_detector_control).
    if (in.quantize == "uint8") {
      x = test_control("feature_range") ? (x * 127.5f + 127.5f).clamp(0.0f, 255.0f).to(at::kByte)
                                        : (x * 127.5f + 128.0f).clamp(0.0f, 255.0f).to(at::kByte);
    } else if ((in.range_min != -1.0 || in.range_max != 1.0) && !test_control("feature_range")) {
      x = (x + 1.0f) * static_cast<float>((in.range_max - in.range_min) / 2.0) + static_cast<float>(in.range_min);
    }
    if (x.size(1) == 1 && in.channels == 3) x = x.expand({b, 3, x.size(2), x.size(3)});
    if (in.resize == "bilinear" && (x.size(2) != in.height || x.size(3) != in.width)) {
      x = at::upsample_bilinear2d(x, {in.height, in.width}, /*align_corners=*/false);
    }
    FeatureBatch out = forward(x.contiguous());
    feats.push_back(out.features);
    if (out.logits.defined()) logits.push_back(out.logits);
  }
  FeatureBatch all;
  all.features = n > 0 ? torch::cat(feats) : torch::zeros({0, feature_dim()}, torch::kDouble);
  if (num_logits() > 0) all.logits = n > 0 ? torch::cat(logits) : torch::zeros({0, num_logits()}, torch::kDouble);
  return all;
}

namespace {

// The Fashion-MNIST classifier (classifier.h): features from fc1, logits from fc2.
class ClassifierNetwork final : public FeatureNetwork {
 public:
  explicit ClassifierNetwork(const std::string& path) : path_(path) {
    ClassifierInfo info;
    try {
      model_ = load_classifier(path, &info);
    } catch (const ClassifierFileError& e) {
      throw FeatureNetworkError(e.what());
    }
    model_->eval();
    std::map<std::string, at::Tensor> weights;
    for (const auto& kv : model_->named_parameters()) weights[kv.key()] = kv.value();
    for (const auto& kv : model_->named_buffers()) weights[kv.key()] = kv.value();
    hash_ = weights_xxh3(weights);
    char acc[32];
    std::snprintf(acc, sizeof acc, "%.4f", info.test_accuracy);
    description_ = "shardgan classifier, " + info.shape.image_shape() + ", " + std::to_string(info.shape.classes) +
                   " classes (test accuracy " + acc + ")";
    input_.channels = info.shape.channels;
    input_.height = input_.width = info.shape.size;
  }
  std::string kind() const override { return "classifier"; }
  const std::string& path() const override { return path_; }
  std::string description() const override { return description_; }
  std::string hash() const override { return hash_; }
  bool comparable_with_papers() const override { return false; }
  int64_t feature_dim() const override { return kClassifierFeatureDim; }
  int64_t num_logits() const override { return model_->shape().classes; }
  const InputContract& input() const override { return input_; }

 protected:
  FeatureBatch forward(const at::Tensor& x) override {
    const at::Tensor f = model_->features(x);
    return {f.to(torch::kDouble), model_->fc2(f).to(torch::kDouble)};
  }

 private:
  std::string path_, description_, hash_;
  Classifier model_{nullptr};
  InputContract input_;
};

}  // namespace

std::unique_ptr<FeatureNetwork> load_feature_network(const std::string& kind, const std::string& path) {
  if (kind == "classifier") return std::make_unique<ClassifierNetwork>(path);
  if (kind == "torchscript") return load_torchscript_network(path);
  throw std::invalid_argument("load_feature_network: kind must be classifier or torchscript, got '" + kind + "'");
}

}  // namespace shardgan::eval
