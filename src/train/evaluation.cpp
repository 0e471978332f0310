#include "shardgan/train/evaluation.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include "shardgan/eval/classifier.h"
#include "shardgan/eval/frechet.h"
#include "shardgan/models/family.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"
#include "shardgan/data/convert.h"
#include "shardgan/data/edges.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/images.h"
#include "shardgan/eval/image_quality.h"
#include "shardgan/train/inference.h"

namespace shardgan {

void put_scores(nlohmann::json& j, const EvalResult& r, const std::string& suffix) {
  j["fid" + suffix] = r.fid;
  if (r.class_acc >= 0) j["class_acc" + suffix] = r.class_acc;
  if (r.l1 >= 0) {
    j["l1" + suffix] = r.l1;
    j["psnr" + suffix] = r.psnr;
    j["ssim" + suffix] = r.ssim;
  }
  j["class_fractions" + suffix] = r.class_fractions;
  if (!r.eval_set.empty()) j["eval_set"] = r.eval_set;
}

std::string image_eval_set(const TrainConfig& cfg) {
  if (!cfg.family || cfg.family->condition_channels() == 0) return "";
  return cfg.data_source == "synthetic" ? "synthetic-edges" : "fashion-mnist-edges";
}

std::string image_eval_mismatch(const TrainConfig& cfg) {
  if (!cfg.family || cfg.family->condition_channels() == 0) return "";
  std::string what;
  if (cfg.data_source == "paired") {
    what = "data.source paired (the A|B images of '" + cfg.data_path + "')";
  } else if (cfg.data_source == "hdf5") {
    const data::Hdf5Dataset ds(cfg.data_path);
    const bool fmnist_edges = ds.channels() == 1 && ds.height() == 32 && ds.width() == 32 &&
                              ds.condition_channels() == 1 && ds.class_names() == data::kFashionMnistClassNames;
    if (fmnist_edges) return "";
    what = "data.source hdf5 ('" + cfg.data_path + "', not Fashion-MNIST's edge pairs from `shardgan-data convert "
           "--paired`)";
  } else {
    return "";
  }
  return cfg.source + ": evaluating model.arch " + cfg.family->arch() + " trained on " + what +
         " scores another task: the evaluation translates the edge maps of Fashion-MNIST's t10k images (" +
         cfg.eval_reference + ") and compares them with those images; its records carry eval_set: " +
         image_eval_set(cfg);
}

namespace {

constexpr int64_t kChunk = 64;  // generated images per rank per G forward

// Collective (one all-gather): merges every rank's moments in rank order, so that every
// rank gets the same bits, and sums `extra` (float64, any length, same on every rank).
eval::FeatureMoments all_reduce_moments(eval::FeatureMoments m, at::Tensor& extra, Communicator& comm) {
  const int64_t F = eval::kClassifierFeatureDim;
  if (!m.mean.defined()) {
    m.mean = torch::zeros({F}, torch::kDouble);
    m.m2 = torch::zeros({F, F}, torch::kDouble);
  }
  const int64_t E = extra.numel(), len = 1 + E + F + F * F, W = comm.world_size();
  const at::Tensor mine = torch::cat({torch::tensor({static_cast<double>(m.n)}, torch::kDouble), extra, m.mean,
                                      m.m2.reshape({-1})});
  at::Tensor all = torch::empty({W * len}, torch::kDouble);
  comm.all_gather(all, mine);
  eval::FeatureMoments merged;
  at::Tensor sum_extra = torch::zeros({E}, torch::kDouble);
  for (int64_t r = 0; r < W; ++r) {
    const at::Tensor p = all.narrow(0, r * len, len);
    eval::FeatureMoments part;
    part.n = static_cast<int64_t>(p[0].item<double>());
    part.mean = p.narrow(0, 1 + E, F);
    part.m2 = p.narrow(0, 1 + E + F, F * F).reshape({F, F});
    sum_extra += p.narrow(0, 1, E);
    merged.merge(part);
  }
  extra = sum_extra;
  return merged;
}

}  // namespace

struct Evaluator::State {
  const TrainConfig& cfg;
  Communicator& comm;
  const ModelFamily& family;
  eval::Classifier classifier{nullptr};
  eval::FeatureStats reference;
  bool class_accuracy = false;  // conditional with the classifier's 10 classes
  at::Tensor held_out;          // image-to-image: the held-out images B (held_out_images)
  at::Tensor held_out_a;        // and their edge maps A, the inputs G translates
  std::string eval_set;         // image-to-image: image_eval_set
};

Evaluator::Evaluator(const TrainConfig& cfg, Communicator& comm, const ModelFamily& family)
    : s_(new State{cfg, comm, family}) {
  const ImageShape shape = family.image_shape();
  if (shape.channels != 1 || shape.height != 32 || shape.width != 32) {
    throw ConfigError(cfg.source + ": eval.enabled needs 1x32x32 images (the Fashion-MNIST classifier's input), "
                      "but the model makes " + std::to_string(shape.channels) + "x" + std::to_string(shape.height) +
                      "x" + std::to_string(shape.width) + "; set eval.enabled: false");
  }
  try {
    s_->classifier = eval::load_classifier(cfg.eval_classifier);
  } catch (const eval::ClassifierFileError& e) {
    throw ConfigError(cfg.source + ": eval.classifier: " + e.what());
  }
  s_->class_accuracy = family.num_classes() == eval::kClassifierClasses;
  if (family.num_classes() > 0 && !s_->class_accuracy && comm.rank() == 0) {
    spdlog::warn("class accuracy needs model.n_classes = {} (the classifier's); FID only", eval::kClassifierClasses);
  }
  // The real statistics: each rank featurizes its contiguous share of the t10k split.
  const at::Tensor real = load_fashion_mnist(cfg.eval_reference, at::kFloat, "t10k");
  const int64_t n = real.size(0), W = comm.world_size(), r = comm.rank();
  eval::FeatureMoments m;
  const int64_t begin = n * r / W, end = n * (r + 1) / W;
  if (end > begin) m.add(eval::extract_features(s_->classifier, real.narrow(0, begin, end - begin)));
  at::Tensor none = torch::zeros({0}, torch::kDouble);
  s_->reference = all_reduce_moments(m, none, comm).stats();
  if (family.condition_channels() > 0) {
    s_->held_out = cfg.data_source == "fashion-mnist" ? real.narrow(0, 0, std::min<int64_t>(cfg.eval_samples, n))
                                                      : held_out_images(cfg, cfg.eval_samples);
    s_->held_out_a = data::sobel_edges(s_->held_out, family.condition_channels());
    s_->eval_set = image_eval_set(cfg);
    const std::string mismatch = image_eval_mismatch(cfg);
    // Not from the memory probe's stand-in world (activation_probe.h), which every rank builds.
    if (!mismatch.empty() && comm.rank() == 0 && comm.backend() != "shadow") spdlog::warn("{}", mismatch);
  }
}

Evaluator::~Evaluator() = default;

EvalResult Evaluator::evaluate(ShardedModel& g, bool identity, double truncation) {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainConfig& cfg = s_->cfg;
  const int64_t W = s_->comm.world_size(), r = s_->comm.rank();
  // Equal shares, so that every rank runs the same number of G forwards of the same size.
  const bool paired = s_->family.condition_channels() > 0;
  if (identity && !paired) throw std::invalid_argument("the identity baseline needs an image-to-image model");
  // Paired: the held-out images split evenly (the remainder of the division is left out).
  const int64_t per_rank = paired ? std::max<int64_t>(1, s_->held_out.size(0) / W) : (cfg.eval_samples + W - 1) / W;
  const int64_t total = per_rank * W;
  at::Generator gen = at::detail::createCPUGenerator(cfg.seed + 5);
  const at::Tensor z = s_->family.sample_truncated_latents(total, gen, cfg.model_dtype, truncation);
  const int64_t classes = s_->family.num_classes();
  const at::Tensor y = classes > 0 ? torch::arange(total, torch::kLong).remainder(classes) : at::Tensor();
  at::Tensor targets, inputs;  // paired: this rank's held-out images B and their edge maps A
  if (paired) {
    if (s_->held_out.size(0) < W) throw std::invalid_argument("eval.samples must be at least the world size");
    targets = s_->held_out.narrow(0, r * per_rank, per_rank);
    inputs = s_->held_out_a.narrow(0, r * per_rank, per_rank);
  }

  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> saved;  // buffers (BatchNorm statistics, spectral-norm u) restored after
  for (auto& kv : g.named_buffers()) saved.push_back(kv.second.clone());
  eval::FeatureMoments m;
  // [0]: correct labels (conditional), [1 + k]: images classified as class k.
  // [1 + 10 + 3]: ... and, paired, the sums of L1, PSNR and SSIM.
  at::Tensor counts = torch::zeros({1 + eval::kClassifierClasses + 3}, torch::kDouble);
  for (int64_t off = 0; off < per_rank; off += kChunk) {
    const int64_t b = std::min(kChunk, per_rank - off), at = r * per_rank + off;
    const at::Tensor yb = paired ? inputs.narrow(0, off, b) : y.defined() ? y.narrow(0, at, b) : at::Tensor();
    const at::Tensor imgs = identity ? yb.to(at::kFloat).expand({b, targets.size(1), targets.size(2), targets.size(3)})
                                     : g.forward({z.narrow(0, at, b).contiguous(), yb}).at(0).to(at::kCPU, at::kFloat);
    if (paired) {
      const eval::ImageScores q = eval::image_scores(imgs, targets.narrow(0, off, b));
      counts.narrow(0, 1 + eval::kClassifierClasses, 3)
          .add_(torch::stack({q.l1.sum(), q.psnr.sum(), q.ssim.sum()}));
    }
    m.add(eval::extract_features(s_->classifier, imgs));
    const at::Tensor predicted = eval::classify(s_->classifier, imgs);
    if (s_->class_accuracy) counts[0] += predicted.eq(yb).sum().to(torch::kDouble);
    counts.narrow(0, 1, eval::kClassifierClasses)
        .add_(torch::bincount(predicted, {}, eval::kClassifierClasses).to(torch::kDouble));
  }
  size_t i = 0;
  for (auto& kv : g.named_buffers()) kv.second.copy_(saved[i++]);
  m = all_reduce_moments(m, counts, s_->comm);
  EvalResult res;
  res.fid = eval::frechet_distance(m.stats(), s_->reference);
  res.class_acc = s_->class_accuracy ? counts[0].item<double>() / static_cast<double>(m.n) : -1;
  for (int64_t k = 0; k < eval::kClassifierClasses; ++k) {
    res.class_fractions.push_back(counts[1 + k].item<double>() / static_cast<double>(m.n));
  }
  if (paired && m.n > 0) {
    const double n = static_cast<double>(m.n);
    res.l1 = counts[1 + eval::kClassifierClasses].item<double>() / n;
    res.psnr = counts[2 + eval::kClassifierClasses].item<double>() / n;
    res.ssim = counts[3 + eval::kClassifierClasses].item<double>() / n;
  }
  res.samples = m.n;
  res.truncation = truncation > 0 ? truncation : 0;
  res.eval_set = s_->eval_set;
  res.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace shardgan
