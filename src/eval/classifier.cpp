// The Fashion-MNIST feature classifier: model, training, HDF5 file, feature extraction.
#include "shardgan/eval/classifier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "eval/atomic_h5.h"
#include "eval/shape_text.h"

#include "shardgan/h5/h5.h"
#include "shardgan/h5/probe.h"

namespace fs = std::filesystem;

namespace shardgan::eval {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using detail::shape_str;

// Checks images [N, C, S, S] of `shape` and a float dtype; returns them as contiguous float32 CPU.
at::Tensor checked_images(const at::Tensor& images, const ClassifierShape& shape, const std::string& what) {
  if (!images.defined() || images.dim() != 4 || images.size(1) != shape.channels || images.size(2) != shape.size ||
      images.size(3) != shape.size) {
    throw std::invalid_argument(what + ": images must be [N, " + std::to_string(shape.channels) + ", " +
                                std::to_string(shape.size) + ", " + std::to_string(shape.size) + "], got " +
                                (images.defined() ? shape_str(images.sizes()) : std::string("undefined")));
  }
  if (!at::isFloatingType(images.scalar_type())) {
    throw std::invalid_argument(what + ": images must have a float dtype, got " +
                                std::string(c10::toString(images.scalar_type())) + " " +
                                shape_str(images.sizes()));
  }
  return images.to(torch::kCPU, torch::kFloat).contiguous();
}

void check_batch(int64_t batch, const std::string& what) {
  if (batch < 1) throw std::invalid_argument(what + ": batch must be >= 1, got " + std::to_string(batch));
}

at::Tensor checked_labels(const at::Tensor& labels, int64_t n, const std::string& what) {
  if (!labels.defined() || labels.dim() != 1 || labels.size(0) != n) {
    throw std::invalid_argument(what + ": labels must be [" + std::to_string(n) + "] (one per image), got " +
                                (labels.defined() ? shape_str(labels.sizes()) : std::string("undefined")));
  }
  return labels.to(torch::kCPU, torch::kLong).contiguous();
}

// `fn` on consecutive batches of `x` in eval mode without autograd, concatenated; the
// module's train/eval mode is restored afterwards (also when fn throws).
template <class Fn>
std::vector<at::Tensor> batched_eval(Classifier& model, const at::Tensor& x, int64_t batch, Fn fn) {
  torch::NoGradGuard no_grad;
  struct ModeGuard {
    Classifier& m;
    bool was;
    ~ModeGuard() { m->train(was); }
  } guard{model, model->is_training()};
  model->eval();
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < x.size(0); i += batch) {
    parts.push_back(fn(x.narrow(0, i, std::min(batch, x.size(0) - i))));
  }
  return parts;
}

// Every named parameter and buffer (parameters first), in registration order.
std::vector<std::pair<std::string, at::Tensor>> named_state(Classifier& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model->named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : model->named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

h5::DType h5_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return h5::DType::kF32;
    case at::kDouble: return h5::DType::kF64;
    case at::kLong: return h5::DType::kI64;
    default: throw std::logic_error("classifier tensor of unexpected dtype " + std::string(c10::toString(t)));
  }
}

std::string fix_hint() { return "; run shardgan-fid train-classifier -o PATH to make one"; }

void reinitialize(Classifier& model) {
  for (auto& m : model->modules(/*include_self=*/false)) {
    if (auto* c = m->as<torch::nn::Conv2d>()) c->reset_parameters();
    if (auto* l = m->as<torch::nn::Linear>()) l->reset_parameters();
    if (auto* b = m->as<torch::nn::BatchNorm2d>()) b->reset_parameters();  // also the running stats
  }
}

}  // namespace

std::string ClassifierShape::image_shape() const {
  return std::to_string(channels) + "x" + std::to_string(size) + "x" + std::to_string(size);
}

ClassifierImpl::ClassifierImpl(ClassifierShape shape) : shape_(shape) {
  using torch::nn::Conv2dOptions;
  if (shape.channels != 1 && shape.channels != 3) {
    throw std::invalid_argument("Classifier: channels must be 1 or 3, got " + std::to_string(shape.channels));
  }
  if (shape.size < 32 || shape.size > 1024 || (shape.size & (shape.size - 1)) != 0) {
    throw std::invalid_argument("Classifier: size must be a power of two from 32 to 1024, got " +
                                std::to_string(shape.size));
  }
  if (shape.classes < 2 || shape.classes > 100000) {
    throw std::invalid_argument("Classifier: classes must be 2 to 100000, got " + std::to_string(shape.classes));
  }
  conv1 = register_module("conv1", torch::nn::Conv2d(Conv2dOptions(shape.channels, 32, 4).stride(2).padding(1)));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(32));
  conv2 = register_module("conv2", torch::nn::Conv2d(Conv2dOptions(32, 64, 3).stride(2).padding(1)));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(64));
  for (int64_t side = shape.size / 4, k = 3; side > 8; side /= 2, ++k) {
    extra_convs.push_back(register_module("conv" + std::to_string(k),
                                          torch::nn::Conv2d(Conv2dOptions(64, 64, 3).stride(2).padding(1))));
    extra_bns.push_back(register_module("bn" + std::to_string(k), torch::nn::BatchNorm2d(64)));
  }
  fc1 = register_module("fc1", torch::nn::Conv2d(Conv2dOptions(64, kClassifierFeatureDim, 8)));
  fc2 = register_module("fc2", torch::nn::Linear(kClassifierFeatureDim, shape.classes));
}

at::Tensor ClassifierImpl::features(const at::Tensor& x) {
  at::Tensor h = torch::relu(bn1(conv1(x)));
  h = torch::relu(bn2(conv2(h)));
  for (size_t i = 0; i < extra_convs.size(); ++i) h = torch::relu(extra_bns[i](extra_convs[i](h)));
  return torch::relu(fc1(h)).flatten(1);
}

at::Tensor ClassifierImpl::forward(const at::Tensor& x) { return fc2(features(x)); }

ClassifierTrainResult train_classifier(Classifier& model, const at::Tensor& train_images,
                                       const at::Tensor& train_labels, const at::Tensor& test_images,
                                       const at::Tensor& test_labels, const ClassifierTrainOptions& opt) {
  if (opt.epochs < 1 || opt.batch < 1 || !(opt.lr > 0) || !(opt.lr_decay > 0) || opt.eval_batch < 1) {
    throw std::invalid_argument("train_classifier: epochs, batch and eval_batch must be >= 1, lr and lr_decay > 0 (got " +
                                std::to_string(opt.epochs) + ", " + std::to_string(opt.batch) + ", " +
                                std::to_string(opt.eval_batch) + ", " + std::to_string(opt.lr) + ")");
  }
  const ClassifierShape& shape = model->shape();
  const at::Tensor xs = checked_images(train_images, shape, "train_classifier: train_images");
  const at::Tensor ys = checked_labels(train_labels, xs.size(0), "train_classifier: train_labels");
  const at::Tensor xt = checked_images(test_images, shape, "train_classifier: test_images");
  const at::Tensor yt = checked_labels(test_labels, xt.size(0), "train_classifier: test_labels");
  if (xs.size(0) == 0 || xt.size(0) == 0) {
    throw std::invalid_argument("train_classifier: empty training or test set");
  }
  for (const at::Tensor& y : {ys, yt}) {
    if (y.min().item<int64_t>() < 0 || y.max().item<int64_t>() >= shape.classes) {
      throw std::invalid_argument("train_classifier: labels must lie in [0, " + std::to_string(shape.classes) +
                                  "), got " + std::to_string(y.min().item<int64_t>()) + " to " +
                                  std::to_string(y.max().item<int64_t>()));
    }
  }

  torch::manual_seed(opt.seed);
  reinitialize(model);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(opt.lr));
  ClassifierTrainResult res;
  res.epochs = opt.epochs;
  const int64_t n = xs.size(0);
  const auto t0 = Clock::now();
  for (int64_t epoch = 0; epoch < opt.epochs; ++epoch) {
    model->train();
    const double lr = opt.lr * std::pow(opt.lr_decay, static_cast<double>(epoch));
    static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).lr(lr);
    const auto te = Clock::now();
    const at::Tensor perm = torch::randperm(n, torch::kLong);
    double loss_sum = 0;
    int64_t steps = 0;
    for (int64_t i = 0; i < n; i += opt.batch) {
      const at::Tensor idx = perm.narrow(0, i, std::min(opt.batch, n - i));
      adam.zero_grad();
      at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(xs.index_select(0, idx)),
                                                             ys.index_select(0, idx));
      loss.backward();
      adam.step();
      loss_sum += loss.item<double>();
      if (++steps % 100 == 0) {
        spdlog::debug("fid classifier: epoch {} step {}: loss {:.4f}, {:.1f} s", epoch + 1, steps,
                      loss.item<double>(), seconds_since(te));
      }
    }
    res.train_loss = loss_sum / static_cast<double>(steps);
    spdlog::info("fid classifier: epoch {}/{}: lr {:.3g}, mean loss {:.4f}, {:.1f} s", epoch + 1, opt.epochs, lr,
                 res.train_loss, seconds_since(te));
  }
  res.train_time_s = seconds_since(t0);
  model->eval();
  const at::Tensor pred = classify(model, xt, opt.eval_batch);
  res.test_accuracy = pred.eq(yt).to(torch::kDouble).mean().item<double>();
  spdlog::info("fid classifier: test accuracy {:.4f} on {} images after {} epochs ({:.1f} s of training)",
               res.test_accuracy, xt.size(0), opt.epochs, res.train_time_s);
  return res;
}

void save_classifier(Classifier& model, const std::string& path, const ClassifierInfo& info) {
  detail::write_h5_atomically(path, [&](h5::File& f) {
    for (const auto& [name, t] : named_state(model)) {
      const at::Tensor c = t.detach().to(torch::kCPU).contiguous();
      f.write(name, h5_dtype(c.scalar_type()), c.sizes().vec(), c.data_ptr());
    }
    f.set_attr("/", "format", std::string(kClassifierFormat));
    f.set_attr("/", "version", kClassifierVersion);
    f.set_attr("/", "image_shape", model->shape().image_shape());
    f.set_attr("/", "feature_dim", kClassifierFeatureDim);
    f.set_attr("/", "num_classes", model->shape().classes);
    f.set_attr("/", "test_accuracy", info.test_accuracy);
    f.set_attr("/", "epochs", info.epochs);
    f.set_attr("/", "seed", info.seed);
    f.set_attr("/", "train_time_s", info.train_time_s);
  });
}

Classifier load_classifier(const std::string& path, ClassifierInfo* info) {
  const std::string where = "FID classifier file '" + path + "'";
  if (!fs::exists(path)) throw ClassifierFileError(where + ": no such file" + fix_hint());
  // A crafted file can crash or hang Debian's libhdf5: a child reads it first (h5/probe.h).
  if (const std::string why = h5::probe_isolated(path, {"*"}); !why.empty()) {
    throw ClassifierFileError(where + ": not a readable HDF5 file (" + why + ")" + fix_hint());
  }
  std::optional<h5::File> f;
  try {
    f.emplace(h5::File::open_read(path));
  } catch (const h5::H5Error& e) {
    throw ClassifierFileError(where + ": not a readable HDF5 file (" + e.what() + ")" + fix_hint());
  }
  std::string format;
  int64_t version = 0, feature_dim = 0;
  try {
    format = f->attr_string("/", "format");
  } catch (const h5::H5Error&) {
    throw ClassifierFileError(where + ": no root attribute 'format' (not a shardgan-fid classifier)" + fix_hint());
  }
  if (format != kClassifierFormat) {
    throw ClassifierFileError(where + ": format is '" + format + "', expected '" + kClassifierFormat + "'" +
                              fix_hint());
  }
  ClassifierInfo got;
  try {
    version = f->attr_int("/", "version");
    feature_dim = f->attr_int("/", "feature_dim");
    got.test_accuracy = f->attr_double("/", "test_accuracy");
    got.epochs = f->attr_int("/", "epochs");
    got.seed = f->attr_int("/", "seed");
    got.train_time_s = f->attr_double("/", "train_time_s");
  } catch (const h5::H5Error& e) {
    throw ClassifierFileError(where + ": " + e.what() + fix_hint());
  }
  if (version != kClassifierVersion || feature_dim != kClassifierFeatureDim) {
    throw ClassifierFileError(where + ": version " + std::to_string(version) + " with feature_dim " +
                              std::to_string(feature_dim) + ", this build reads version " +
                              std::to_string(kClassifierVersion) + " with feature_dim " +
                              std::to_string(kClassifierFeatureDim) + fix_hint());
  }
  // image_shape "CxSxS" and num_classes K (files from before other datasets: 1x32x32, 10).
  ClassifierShape shape;
  try {
    const std::string text = f->attr_string("/", "image_shape");
    long long c = 0, h = 0, w = 0;
    char tail = 0;
    if (std::sscanf(text.c_str(), "%lldx%lldx%lld%c", &c, &h, &w, &tail) != 3 || h != w) {
      throw ClassifierFileError(where + ": image_shape '" + text + "' is not CxSxS" + fix_hint());
    }
    shape.channels = c;
    shape.size = h;
    shape.classes = f->attr_int("/", "num_classes");
  } catch (const h5::H5Error& e) {
    throw ClassifierFileError(where + ": " + e.what() + fix_hint());
  }
  std::optional<Classifier> built;
  try {
    built.emplace(shape);
  } catch (const std::invalid_argument& e) {
    throw ClassifierFileError(where + ": image_shape " + shape.image_shape() + " with num_classes " +
                              std::to_string(shape.classes) + ": " + e.what() + fix_hint());
  }
  Classifier model = *built;
  got.shape = shape;
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : named_state(model)) {
    if (!f->exists(name)) throw ClassifierFileError(where + ": missing dataset '" + name + "'" + fix_hint());
    const std::vector<int64_t> shape = f->shape(name);
    if (shape != t.sizes().vec()) {
      throw ClassifierFileError(where + ": dataset '" + name + "' is " + shape_str(shape) + ", expected " +
                                shape_str(t.sizes()) + fix_hint());
    }
    try {
      f->read(name, h5_dtype(t.scalar_type()), t.data_ptr(), t.numel());
    } catch (const h5::H5Error& e) {
      throw ClassifierFileError(where + ": dataset '" + name + "': " + e.what() + fix_hint());
    }
  }
  model->eval();
  if (info) *info = got;
  return model;
}

at::Tensor extract_features(Classifier& model, const at::Tensor& images, int64_t batch) {
  const at::Tensor x = checked_images(images, model->shape(), "extract_features");
  check_batch(batch, "extract_features");
  if (x.size(0) == 0) return torch::zeros({0, kClassifierFeatureDim}, torch::kDouble);
  return torch::cat(batched_eval(model, x, batch, [&](const at::Tensor& b) { return model->features(b); }))
      .to(torch::kDouble);
}

at::Tensor classify(Classifier& model, const at::Tensor& images, int64_t batch) {
  const at::Tensor x = checked_images(images, model->shape(), "classify");
  check_batch(batch, "classify");
  if (x.size(0) == 0) return torch::zeros({0}, torch::kLong);
  return torch::cat(batched_eval(model, x, batch, [&](const at::Tensor& b) { return model->forward(b).argmax(1); }));
}

}  // namespace shardgan::eval
