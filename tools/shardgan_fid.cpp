// shardgan-fid: the Fashion-MNIST feature classifier of shardgan's FID, and sanity numbers.
// Needs no MPI runtime (no mpirun, no MPI_Init).
//   shardgan-fid train-classifier [--data DIR|FILE.h5] [-o runs/fmnist-classifier.h5] [--epochs 3] [--seed 1]
//   shardgan-fid compare --classifier PATH [--data DIR] [-n 10000]
//   shardgan-fid stats SOURCE -o REF.h5 [--classifier PATH | --feature-network NET.pt] [--split t10k|train]
//                [--reference-samples N]
// SOURCE of stats is a Fashion-MNIST folder (its --split) or an HDF5 file from shardgan-data convert.
// DIR holds Fashion-MNIST's idx .gz files (default $SHARDGAN_FMNIST_DIR, else
// /usr/share/datasets/fashion-mnist). Exit status: 0 fine, 1 an error or a classifier below
// --min-accuracy, 2 bad usage. See docs/fid.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/eval/classifier.h"
#include "shardgan/eval/frechet.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/images.h"
#include "shardgan/eval/feature_network.h"
#include "shardgan/eval/reference_stats.h"
#include "shardgan/train/evaluation.h"

using namespace shardgan;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A labelled HDF5 file (shardgan-data convert): every image whose index is 9 mod 10 is held
// out as the test set, the rest train; K = the largest label + 1 (at least the class names).
void split_labelled_file(const std::string& path, at::Tensor& xs, at::Tensor& ys, at::Tensor& xt, at::Tensor& yt,
                         eval::ClassifierShape& shape) {
  const data::Hdf5Dataset ds(path);
  if (ds.height() != ds.width()) {
    throw std::invalid_argument(path + ": images of " + std::to_string(ds.height()) + "x" + std::to_string(ds.width()) +
                                "; the classifier takes square images");
  }
  if (ds.min_label() < 0 || ds.size() < 20) {
    throw std::invalid_argument(path + ": needs labels >= 0 and at least 20 images (has " +
                                std::to_string(ds.size()) + ")");
  }
  at::Tensor images, labels;
  ds.read(torch::arange(ds.size(), torch::kLong), at::kFloat, &images, &labels);
  const at::Tensor test = torch::arange(ds.size(), torch::kLong).remainder(10).eq(9);
  xs = images.index({test.logical_not()});
  ys = labels.index({test.logical_not()});
  xt = images.index({test});
  yt = labels.index({test});
  shape.channels = ds.channels();
  shape.size = ds.height();
  shape.classes = std::max<int64_t>(ds.max_label() + 1, static_cast<int64_t>(ds.class_names().size()));
}

int cmd_train(const std::string& data, const std::string& out, const eval::ClassifierTrainOptions& opt,
              double min_accuracy, int64_t limit) {
  at::Tensor xs, ys, xt, yt;
  eval::ClassifierShape shape;
  if (std::filesystem::is_regular_file(data)) {
    split_labelled_file(data, xs, ys, xt, yt, shape);
  } else {
    xs = load_fashion_mnist(data, at::kFloat, "train");
    ys = load_fashion_mnist_labels(data, "train");
    xt = load_fashion_mnist(data, at::kFloat, "t10k");
    yt = load_fashion_mnist_labels(data, "t10k");
  }
  if (limit > 0 && limit < xs.size(0)) {
    xs = xs.narrow(0, 0, limit);
    ys = ys.narrow(0, 0, limit);
  }
  eval::Classifier model(shape);
  std::printf("classifier for %s images, %lld classes: %lld training and %lld test images\n",
              shape.image_shape().c_str(), (long long)shape.classes, (long long)xs.size(0), (long long)xt.size(0));
  const eval::ClassifierTrainResult r = eval::train_classifier(model, xs, ys, xt, yt, opt);
  std::printf("test accuracy %.4f on %lld test images after %lld epochs, %.1f s of training (%d threads)\n",
              r.test_accuracy, (long long)xt.size(0), (long long)r.epochs, r.train_time_s,
              torch::get_num_threads());
  if (r.test_accuracy < min_accuracy) {
    std::fprintf(stderr,
                 "shardgan-fid: error: test accuracy %.4f is below --min-accuracy %.4f; not writing %s "
                 "(train longer with --epochs or try another --seed)\n",
                 r.test_accuracy, min_accuracy, out.c_str());
    return 1;
  }
  eval::save_classifier(model, out, {r.test_accuracy, r.epochs, static_cast<int64_t>(opt.seed), r.train_time_s});
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

int cmd_compare(const std::string& data, const std::string& path, int64_t n, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  eval::ClassifierInfo info;
  eval::Classifier model = eval::load_classifier(path, &info);
  const at::Tensor xt = load_fashion_mnist(data, at::kFloat, "t10k");
  const at::Tensor yt = load_fashion_mnist_labels(data, "t10k");
  const at::Tensor xs = load_fashion_mnist(data, at::kFloat, "train");
  const int64_t n_train = std::min<int64_t>(n, xs.size(0));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor noise = torch::rand({n, 1, 32, 32}, gen, torch::kFloat) * 2 - 1;

  const eval::FeatureStats test = eval::feature_stats(eval::extract_features(model, xt));
  const eval::FeatureStats train = eval::feature_stats(eval::extract_features(model, xs.narrow(0, 0, n_train)));
  const eval::FeatureStats rnd = eval::feature_stats(eval::extract_features(model, noise));
  nlohmann::ordered_json j;
  j["classifier"] = path;
  j["feature_dim"] = eval::kClassifierFeatureDim;
  j["test_accuracy_stored"] = info.test_accuracy;
  j["test_accuracy"] = eval::class_accuracy(eval::classify(model, xt), yt);
  j["n_test"] = xt.size(0);
  j["n_train"] = n_train;
  j["n_noise"] = n;
  j["fid_test_vs_train"] = eval::frechet_distance(test, train);
  j["fid_test_vs_noise"] = eval::frechet_distance(test, rnd);
  j["fid_train_vs_noise"] = eval::frechet_distance(train, rnd);
  j["time_s"] = seconds_since(t0);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// The reference statistics file of `source` (evaluation.h's reference_images) through one
// feature network, as eval.reference_cache stores it; prints one JSON line.
int cmd_stats(const std::string& source, const std::string& out, const std::string& classifier,
              const std::string& network, const std::string& split, int64_t max_images) {
  const auto t0 = std::chrono::steady_clock::now();
  auto net = network.empty() ? eval::load_feature_network("classifier", classifier)
                             : eval::load_feature_network("torchscript", network);
  const at::Tensor images = reference_images(source, max_images, split);
  const eval::FeatureBatch fb = net->run(images, net->kind() == "classifier" ? 256 : 64);
  eval::FeatureMoments m;
  m.add(fb.features);
  const std::string images_hash = eval::images_xxh3(images);
  eval::save_reference_stats(out, {m.stats(), fb.features, net->hash(), net->description(), images_hash, source});
  nlohmann::ordered_json j;
  j["output"] = out;
  j["source"] = source;
  j["count"] = images.size(0);
  j["feature_dim"] = net->feature_dim();
  j["network"] = net->description();
  j["network_xxh3"] = net->hash();
  j["images_xxh3"] = images_hash;
  j["time_s"] = seconds_since(t0);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardgan-fid: the Fashion-MNIST classifier behind shardgan's FID, and sanity numbers"};
  app.require_subcommand(1);
  // SHARDGAN_FMNIST_DIR sets the default here, not through CLI11's envname: CLI11 fills an
  // option from the environment in every subcommand, selected or not, so compare's --data
  // would overwrite the --data given to train-classifier (both write `data`).
  const char* fmnist_env = std::getenv("SHARDGAN_FMNIST_DIR");
  std::string data = fmnist_env != nullptr && *fmnist_env != '\0' ? std::string(fmnist_env)
                                                                  : std::string("/usr/share/datasets/fashion-mnist");
  std::string out = "runs/fmnist-classifier.h5", classifier;
  eval::ClassifierTrainOptions opt;
  double min_accuracy = 0.90;
  int64_t n = 10000;
  uint64_t noise_seed = 1;
  int threads = 2;
  int64_t limit = 0;
  auto* train = app.add_subcommand("train-classifier", "train the feature classifier and save it (HDF5)");
  auto* compare = app.add_subcommand("compare", "JSON: FD(test, train), FD(test, noise), test accuracy");
  for (auto* sc : {train, compare}) {
    sc->add_option("--data", data, "folder of Fashion-MNIST's idx .gz files, or (train-classifier) a labelled "
                   "HDF5 file from shardgan-data convert, whose images 9 mod 10 are the test set")
        ->capture_default_str();
    sc->add_option("--threads", threads, "torch CPU threads")->check(CLI::PositiveNumber)->capture_default_str();
  }
  train->add_option("-o,--output", out, "classifier file to write")->capture_default_str();
  train->add_option("--epochs", opt.epochs, "passes over the training images")
      ->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--seed", opt.seed, "initialization and shuffling seed")->capture_default_str();
  train->add_option("--batch", opt.batch, "images per Adam step")->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--lr", opt.lr, "Adam learning rate of the first epoch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--lr-decay", opt.lr_decay, "learning rate factor after each epoch")
      ->check(CLI::PositiveNumber)->capture_default_str();
  train->add_option("--limit", limit, "train on the first N training images only (quick experiments; 0: all)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--min-accuracy", min_accuracy, "exit 1 without writing below this test accuracy")
      ->capture_default_str();
  compare->add_option("--classifier", classifier, "classifier file (from train-classifier)")->required();
  compare->add_option("-n,--count", n, "training images (the first N) and noise images to compare with")
      ->check(CLI::Range(int64_t{2}, int64_t{60000}))->capture_default_str();
  compare->add_option("--seed", noise_seed, "seed of the uniform noise images")->capture_default_str();
  std::string source, stats_out, network, split = "t10k";
  int64_t max_images = 10000;
  auto* stats = app.add_subcommand("stats", "reference statistics (HDF5) of a dataset through a feature network");
  stats->add_option("source", source, "a Fashion-MNIST folder or an HDF5 file from shardgan-data convert")->required();
  stats->add_option("-o,--output", stats_out, "statistics file to write (eval.reference_cache)")->required();
  stats->add_option("--classifier", classifier, "classifier file (default runs/fmnist-classifier.h5)")
      ->default_str("runs/fmnist-classifier.h5");
  stats->add_option("--feature-network", network, "TorchScript feature network (scripts/export_inception.py) "
                    "instead of the classifier");
  stats->add_option("--split", split, "Fashion-MNIST split of a folder source")
      ->check(CLI::IsMember({"t10k", "train"}))->capture_default_str();
  stats->add_option("--reference-samples", max_images, "at most this many images, evenly spaced (eval.reference_samples)")
      ->check(CLI::Range(int64_t{2}, int64_t{10000000}))->capture_default_str();
  stats->add_option("--threads", threads, "torch CPU threads")->check(CLI::PositiveNumber)->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    torch::set_num_threads(threads);
    if (*train) return cmd_train(data, out, opt, min_accuracy, limit);
    if (*compare) return cmd_compare(data, classifier, n, noise_seed);
    if (*stats) {
      return cmd_stats(source, stats_out, classifier.empty() ? "runs/fmnist-classifier.h5" : classifier, network, split,
                       max_images);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardgan-fid: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
