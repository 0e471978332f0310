#include "shardgan/train/evaluation.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/communicator.h"
#include <filesystem>

#include "shardgan/eval/classifier.h"
#include "shardgan/eval/feature_metrics.h"
#include "shardgan/eval/feature_network.h"
#include "shardgan/eval/frechet.h"
#include "shardgan/eval/reference_stats.h"
#include "shardgan/models/family.h"
#include "shardgan/sharding/sharded_model.h"
#include "shardgan/train/config.h"
#include "shardgan/data/convert.h"
#include "shardgan/data/edges.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/images.h"
#include "shardgan/eval/image_quality.h"
#include "shardgan/train/inference.h"
#include "shardgan/util/test_control.h"

namespace shardgan {

void put_scores(nlohmann::json& j, const EvalResult& r, const std::string& suffix) {
  j["fid" + suffix] = r.fid;
  if (r.kid_subsets > 0) {
    j["kid" + suffix] = r.kid;
    j["kid_std" + suffix] = r.kid_std;
  }
  if (r.precision >= 0) {
    j["precision" + suffix] = r.precision;
    j["recall" + suffix] = r.recall;
  }
  if (r.inception_score >= 0) {
    j["is" + suffix] = r.inception_score;
    j["is_std" + suffix] = r.inception_score_std;
  }
  if (r.class_acc >= 0) j["class_acc" + suffix] = r.class_acc;
  if (r.l1 >= 0) {
    j["l1" + suffix] = r.l1;
    j["psnr" + suffix] = r.psnr;
    j["ssim" + suffix] = r.ssim;
  }
  if (!r.class_fractions.empty()) j["class_fractions" + suffix] = r.class_fractions;
  if (!r.eval_set.empty()) j["eval_set"] = r.eval_set;
  if (!r.features.empty()) {
    j["features"] = r.features;
    if (!r.pr_features.empty()) j["pr_features"] = r.pr_features;
    j["kid_subset_size"] = r.kid_subset_size;
    j["paper_comparable"] = r.paper_comparable;
  }
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
eval::FeatureMoments all_reduce_moments(eval::FeatureMoments m, at::Tensor& extra, Communicator& comm, int64_t F) {
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

// Collective (one all-gather): every rank's rows [counts[r], K] (float64) in rank order.
// `counts` is the same on every rank.
at::Tensor gather_rows(const at::Tensor& mine, const std::vector<int64_t>& counts, Communicator& comm) {
  const int64_t K = mine.size(1), most = *std::max_element(counts.begin(), counts.end());
  at::Tensor padded = torch::zeros({most, K}, torch::kDouble);
  padded.narrow(0, 0, mine.size(0)).copy_(mine);
  at::Tensor all = torch::empty({static_cast<int64_t>(counts.size()) * most * K}, torch::kDouble);
  comm.all_gather(all, padded.reshape({-1}));
  std::vector<at::Tensor> parts;
  for (size_t r = 0; r < counts.size(); ++r) {
    parts.push_back(all.narrow(0, static_cast<int64_t>(r) * most * K, counts[r] * K).reshape({counts[r], K}));
  }
  return torch::cat(parts);
}

// Collective (one all-gather): each rank runs its contiguous share of `images` through
// `net` (`local` receives that share's features when not null); every rank gets all the
// features, float64 [N, F], in image order.
at::Tensor featurize_shares(eval::FeatureNetwork& net, const at::Tensor& images, int64_t batch, Communicator& comm,
                            at::Tensor* local = nullptr) {
  const int64_t n = images.size(0), W = comm.world_size(), r = comm.rank();
  std::vector<int64_t> counts;
  for (int64_t q = 0; q < W; ++q) counts.push_back(n * (q + 1) / W - n * q / W);
  const int64_t begin = n * r / W, end = n * (r + 1) / W;
  at::Tensor mine = torch::zeros({0, net.feature_dim()}, torch::kDouble);
  if (end > begin) mine = net.run(images.narrow(0, begin, end - begin), batch).features;
  if (local) *local = mine;
  return gather_rows(mine, counts, comm);
}

std::string network_label(const eval::FeatureNetwork& net) {
  return net.kind() + ": " + net.description() + " (" + net.path() + ", weights xxh3 " + net.hash() + ")";
}

// `n` indices spread evenly over [0, size): floor(i size / n), all of them when n >= size.
at::Tensor spread_indices(int64_t size, int64_t n) {
  if (n >= size) return torch::arange(size, torch::kLong);
  return torch::arange(n, torch::kLong).mul(size).div(n, "floor");
}

}  // namespace

at::Tensor reference_images(const std::string& source, int64_t max_images, const std::string& split) {
  if (!std::filesystem::is_regular_file(source)) {
    const at::Tensor all = load_fashion_mnist(source, at::kFloat, split);
    return all.index_select(0, spread_indices(all.size(0), max_images));
  }
  const data::Hdf5Dataset ds(source);
  at::Tensor images;
  ds.read(spread_indices(ds.size(), max_images), at::kFloat, &images, nullptr);
  return images;
}

struct Evaluator::State {
  const TrainConfig& cfg;
  Communicator& comm;
  const ModelFamily& family;
  std::unique_ptr<eval::FeatureNetwork> network;
  std::unique_ptr<eval::FeatureNetwork> pr_network;  // eval.pr_feature_network, or none
  at::Tensor pr_reference_features;                  // its features of the reference images, every rank
  eval::FeatureStats reference;
  at::Tensor reference_features;  // float64 [N_ref, F], every rank: KID and precision/recall
  at::Tensor real_radii_sq;       // rank 0, from the first evaluation: the reference manifold's radii
  int64_t batch = 64;           // images per feature-network call
  bool class_accuracy = false;  // conditional with the classifier's 10 classes
  at::Tensor held_out;          // image-to-image: the held-out images B (held_out_images)
  at::Tensor held_out_a;        // and their edge maps A, the inputs G translates
  std::string eval_set;         // image-to-image: image_eval_set
};

Evaluator::Evaluator(const TrainConfig& cfg, Communicator& comm, const ModelFamily& family)
    : s_(new State{cfg, comm, family}) {
  const ImageShape shape = family.image_shape();
  const bool classifier = cfg.eval_features == "classifier";
  const std::string key = classifier ? "eval.classifier" : "eval.feature_network";
  try {
    s_->network = eval::load_feature_network(cfg.eval_features, classifier ? cfg.eval_classifier
                                                                            : cfg.eval_feature_network);
    s_->network->check_images(shape.channels, shape.height, shape.width);
  } catch (const eval::FeatureNetworkError& e) {
    throw ConfigError(cfg.source + ": " + key + ": " + e.what() + (classifier ? "; or set eval.enabled: false" : ""));
  }
  if (!cfg.eval_pr_feature_network.empty()) {
    try {
      s_->pr_network = eval::load_feature_network("torchscript", cfg.eval_pr_feature_network);
      s_->pr_network->check_images(shape.channels, shape.height, shape.width);
    } catch (const eval::FeatureNetworkError& e) {
      throw ConfigError(cfg.source + ": eval.pr_feature_network: " + e.what() +
                        "; or leave eval.pr_feature_network empty (precision/recall on eval.features)");
    }
  }
  s_->batch = classifier ? 256 : 64;
  s_->class_accuracy = classifier && family.num_classes() == s_->network->num_logits();
  if (classifier && family.num_classes() > 0 && !s_->class_accuracy && comm.rank() == 0) {
    spdlog::warn("class accuracy needs model.n_classes = {} (the classifier's); FID only", s_->network->num_logits());
  }
  const bool paired = family.condition_channels() > 0;
  if (paired && std::filesystem::is_regular_file(cfg.eval_reference)) {
    throw ConfigError(cfg.source + ": eval.reference: model.arch " + std::string(family.arch()) +
                      " is scored on Fashion-MNIST's t10k edge maps, so eval.reference must be a Fashion-MNIST "
                      "folder, not the file '" + cfg.eval_reference + "'");
  }
  // The real features: each rank featurizes its contiguous share of the reference images.
  const at::Tensor real = reference_images(cfg.eval_reference, cfg.eval_reference_samples);
  try {
    s_->network->check_images(real.size(1), real.size(2), real.size(3));
    if (s_->pr_network) s_->pr_network->check_images(real.size(1), real.size(2), real.size(3));
  } catch (const eval::FeatureNetworkError& e) {
    throw ConfigError(cfg.source + ": eval.reference '" + cfg.eval_reference + "': " + e.what());
  }
  if (s_->pr_network) s_->pr_reference_features = featurize_shares(*s_->pr_network, real, 64, comm);
  const std::string& cache = cfg.eval_reference_cache;
  const std::string real_hash = cache.empty() ? "" : eval::images_xxh3(real);
  // Rank 0 decides whether the cache exists, so that every rank takes the same branch.
  at::Tensor cached = torch::zeros({1}, torch::kDouble);
  if (!cache.empty() && comm.rank() == 0 && std::filesystem::exists(cache)) cached.fill_(1.0);
  if (!cache.empty()) comm.broadcast(cached, 0);
  if (cached.item<double>() > 0) {
    try {
      eval::ReferenceStats rs = eval::load_reference_stats(cache);
      eval::check_reference_stats(rs, cache, s_->network->hash(), real_hash);
      s_->reference = rs.stats;
      s_->reference_features = rs.features.defined()
                                   ? rs.features
                                   : torch::zeros({0, s_->network->feature_dim()}, torch::kDouble);
      if (rs.images_xxh3 == eval::kImagesUnchecked && comm.rank() == 0 && comm.backend() != "shadow") {
        spdlog::warn("{}: eval.reference_cache {} was made elsewhere: its images are not checked against {}{}",
                     cfg.source, cache, cfg.eval_reference,
                     rs.features.defined() ? "" : "; it has no features, so only FID is computed");
      }
    } catch (const eval::ReferenceStatsError& e) {
      throw ConfigError(cfg.source + ": eval.reference_cache: " + e.what());
    }
    if (comm.rank() == 0 && comm.backend() != "shadow") {
      spdlog::info("reference features from {} ({} images)", cache, s_->reference.n);
    }
  } else {
    compute_reference(real);
    if (!cache.empty() && comm.rank() == 0 && comm.backend() != "shadow") {
      eval::save_reference_stats(cache, {s_->reference, s_->reference_features, s_->network->hash(),
                                         s_->network->description(), real_hash, cfg.eval_reference});
      spdlog::info("wrote the reference features to {}", cache);
    }
  }
  if (paired) {
    s_->held_out = cfg.data_source == "fashion-mnist"
                       ? load_fashion_mnist(cfg.eval_reference, at::kFloat, "t10k").narrow(0, 0, std::min<int64_t>(cfg.eval_samples, 10000))
                       : held_out_images(cfg, cfg.eval_samples);
    s_->held_out_a = data::sobel_edges(s_->held_out, family.condition_channels());
    s_->eval_set = image_eval_set(cfg);
    const std::string mismatch = image_eval_mismatch(cfg);
    // Not from the memory probe's stand-in world (activation_probe.h), which every rank builds.
    if (!mismatch.empty() && comm.rank() == 0 && comm.backend() != "shadow") spdlog::warn("{}", mismatch);
  }
}

void Evaluator::compute_reference(const at::Tensor& real) {
  at::Tensor mine;
  s_->reference_features = featurize_shares(*s_->network, real, s_->batch, s_->comm, &mine);
  eval::FeatureMoments m;
  if (mine.size(0) > 0) m.add(mine);
  at::Tensor none = torch::zeros({0}, torch::kDouble);
  s_->reference = all_reduce_moments(m, none, s_->comm, s_->network->feature_dim()).stats();
}

Evaluator::~Evaluator() = default;

void Evaluator::feature_metrics(EvalResult& res, const at::Tensor& features, const at::Tensor& logits,
                                const at::Tensor& pr_features, int64_t W) {
  const TrainConfig& cfg = s_->cfg;
  const eval::FeatureNetwork& net = *s_->network;
  const std::vector<int64_t> counts(static_cast<size_t>(W), features.size(0));
  const at::Tensor fake = gather_rows(features, counts, s_->comm);
  const bool with_is = net.kind() == "torchscript" && net.num_logits() > 0;
  const at::Tensor all_logits = with_is ? gather_rows(logits, counts, s_->comm) : at::Tensor();
  const at::Tensor& real = s_->reference_features;
  const int64_t n_fake = fake.size(0), n_real = real.size(0);
  // Precision and recall on eval.pr_feature_network's features when it names one (the
  // negative control of ctest pr_network_control keeps them on the main network's).
  const bool own_pr = pr_features.defined() && !test_control("pr_main_features");
  const at::Tensor pr_fake = own_pr ? gather_rows(pr_features, counts, s_->comm) : fake;
  const at::Tensor& pr_real = own_pr ? s_->pr_reference_features : real;
  // Rank 0 computes (float64, seconds at 2,000 samples of width 2,048) and broadcasts.
  at::Tensor out = torch::full({8}, -1.0, torch::kDouble);
  if (s_->comm.rank() == 0) {
    const int64_t subset = std::min({cfg.eval_kid_subset_size, n_fake, n_real});
    if (subset >= 2) {
      const eval::MeanStd kid = eval::kernel_inception_distance(real, fake, cfg.eval_kid_subsets, subset, 0);
      out[0] = kid.mean;
      out[1] = kid.std;
      out[2] = static_cast<double>(subset);
    }
    if (std::min(pr_fake.size(0), pr_real.size(0)) > 3) {
      // The reference set's radii once per Evaluator: O(N_ref² F), the bulk of the cost.
      if (!s_->real_radii_sq.defined()) s_->real_radii_sq = eval::manifold_radii_sq(pr_real, 3);
      const eval::PrecisionRecall pr = eval::precision_recall(pr_real, pr_fake, s_->real_radii_sq, 3);
      out[3] = pr.precision;
      out[4] = pr.recall;
    }
    if (with_is && n_fake >= 1) {
      const eval::MeanStd is = eval::inception_score(all_logits, std::min<int64_t>(10, n_fake));
      out[5] = is.mean;
      out[6] = is.std;
    }
  }
  s_->comm.broadcast(out, 0);
  if (out[2].item<double>() >= 2) {
    res.kid = out[0].item<double>();
    res.kid_std = out[1].item<double>();
    res.kid_subset_size = static_cast<int64_t>(out[2].item<double>());
    res.kid_subsets = cfg.eval_kid_subsets;
  }
  res.precision = out[3].item<double>();
  res.recall = out[4].item<double>();
  res.inception_score = out[5].item<double>();
  res.inception_score_std = out[6].item<double>();
  res.features = network_label(net);
  if (pr_features.defined()) res.pr_features = network_label(*s_->pr_network);
  res.paper_comparable = net.comparable_with_papers() && n_fake >= kPaperSamples && n_real >= kPaperSamples;
}

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
  eval::FeatureNetwork& net = *s_->network;
  const bool classifier = net.kind() == "classifier";
  eval::FeatureMoments m;
  std::vector<at::Tensor> features{torch::zeros({0, net.feature_dim()}, torch::kDouble)}, logits;
  std::vector<at::Tensor> pr_features;
  if (s_->pr_network) pr_features.push_back(torch::zeros({0, s_->pr_network->feature_dim()}, torch::kDouble));
  const int64_t K = classifier ? net.num_logits() : 0;
  // [0]: correct labels (conditional), [1 + k]: images classified as class k.
  // [1 + K ... 1 + K + 2]: paired, the sums of L1, PSNR and SSIM.
  at::Tensor counts = torch::zeros({1 + K + 3}, torch::kDouble);
  for (int64_t off = 0; off < per_rank; off += kChunk) {
    const int64_t b = std::min(kChunk, per_rank - off), at = r * per_rank + off;
    const at::Tensor yb = paired ? inputs.narrow(0, off, b) : y.defined() ? y.narrow(0, at, b) : at::Tensor();
    const at::Tensor imgs = identity ? yb.to(at::kFloat).expand({b, targets.size(1), targets.size(2), targets.size(3)})
                                     : g.forward({z.narrow(0, at, b).contiguous(), yb}).at(0).to(at::kCPU, at::kFloat);
    if (paired) {
      const eval::ImageScores q = eval::image_scores(imgs, targets.narrow(0, off, b));
      counts.narrow(0, 1 + K, 3)
          .add_(torch::stack({q.l1.sum(), q.psnr.sum(), q.ssim.sum()}));
    }
    const eval::FeatureBatch fb = net.run(imgs, s_->batch);
    m.add(fb.features);
    features.push_back(fb.features);
    if (fb.logits.defined()) logits.push_back(fb.logits);
    if (s_->pr_network) pr_features.push_back(s_->pr_network->run(imgs, 64).features);
    if (classifier) {
      const at::Tensor predicted = fb.logits.argmax(1);
      if (s_->class_accuracy) counts[0] += predicted.eq(yb).sum().to(torch::kDouble);
      counts.narrow(0, 1, K).add_(torch::bincount(predicted, {}, K).to(torch::kDouble));
    }
  }
  size_t i = 0;
  for (auto& kv : g.named_buffers()) kv.second.copy_(saved[i++]);
  m = all_reduce_moments(m, counts, s_->comm, net.feature_dim());
  EvalResult res;
  res.fid = eval::frechet_distance(m.stats(), s_->reference);
  if (classifier) {
    res.class_acc = s_->class_accuracy ? counts[0].item<double>() / static_cast<double>(m.n) : -1;
    for (int64_t k = 0; k < K; ++k) {
      res.class_fractions.push_back(counts[1 + k].item<double>() / static_cast<double>(m.n));
    }
  }
  feature_metrics(res, torch::cat(features), logits.empty() ? at::Tensor() : torch::cat(logits),
                  pr_features.empty() ? at::Tensor() : torch::cat(pr_features), W);
  if (paired && m.n > 0) {
    const double n = static_cast<double>(m.n);
    res.l1 = counts[1 + K].item<double>() / n;
    res.psnr = counts[2 + K].item<double>() / n;
    res.ssim = counts[3 + K].item<double>() / n;
  }
  res.samples = m.n;
  res.truncation = truncation > 0 ? truncation : 0;
  res.eval_set = s_->eval_set;
  res.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace shardgan
