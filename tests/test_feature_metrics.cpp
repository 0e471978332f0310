// KID, improved precision/recall and the Inception Score (src/eval/feature_metrics.cpp) against
// an independent float64 numpy computation (tests/feature_metrics_ref.py), plus checks with
// known answers and the refusals of bad input. ctest kid_pr_is; kid_pr_is_control runs the
// comparison with SHARDGAN_TEST_CONTROL=kid_biased (the biased MMD) and must fail.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardgan/eval/feature_metrics.h"

// The gtest files compile together in batches (tests/CMakeLists.txt): this file's names
// live in a namespace of its own.
namespace SHARDGAN_UNITY_ID {

using namespace shardgan::eval;

namespace {

// The interpreter: $SHARDGAN_PYTHON, else the one the build was configured with.
std::string python_path() {
  const char* env = std::getenv("SHARDGAN_PYTHON");
  return env && *env ? env : SHARDGAN_PYTHON;
}

void write_raw(const std::filesystem::path& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  ASSERT_TRUE(f.good()) << path;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A fresh directory under /tmp, removed with its files (~25 MB) at scope exit, on every path,
// unless SHARDGAN_KEEP_TEST_FILES is set.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/shardgan_kid_pr_is_XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    if (path.empty()) return;
    if (std::getenv("SHARDGAN_KEEP_TEST_FILES")) {
      std::printf("inputs and ref.txt kept in %s\n", path.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Standard normal [n, d] float32 from a seeded generator.
at::Tensor normal(int64_t n, int64_t d, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, 1.0, {n, d}, gen, torch::kFloat);
}

// Strings that `fn` throws as std::invalid_argument must contain.
template <class Fn>
void expect_invalid(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one naming '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

// 2,560 real and 2,560 fake features of width 64 (float32, converted by the library), the
// fakes scaled and shifted; KID over 20 explicit subsets of 1,000; 2,560 x 1008 logits.
TEST(FeatureMetrics, MatchesFloat64Python) {
  const std::string python = python_path();
  if (access(python.c_str(), X_OK) != 0) GTEST_SKIP() << "no Python at " << python << " (SHARDGAN_PYTHON)";
  if (std::system((python + " -c 'import numpy' 2> /dev/null").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import numpy";
  }
  const int64_t n = 2560, d = 64, subsets = 20, m = 1000, classes = 1008, splits = 10, k = 3;
  const at::Tensor real = normal(n, d, 1);
  const at::Tensor fake = normal(n, d, 2) * 1.1f + 0.12f;
  const at::Tensor logits = normal(n, classes, 3) * 3.0f;
  const KidSubsets idx = draw_kid_subsets(n, n, subsets, m, 7);

  const TempDir tmp;
  ASSERT_FALSE(tmp.path.empty()) << "mkdtemp in /tmp failed";
  const std::filesystem::path& dir = tmp.path;
  write_raw(dir / "real.f64", real.to(torch::kDouble));
  write_raw(dir / "fake.f64", fake.to(torch::kDouble));
  write_raw(dir / "kid_real.i64", idx.real);
  write_raw(dir / "kid_fake.i64", idx.fake);
  write_raw(dir / "logits.f64", logits.to(torch::kDouble));
  {
    std::ofstream meta(dir / "meta.txt");
    meta << "n_real " << n << "\nn_fake " << n << "\nwidth " << d << "\nsubsets " << subsets << "\nsubset_real " << m
         << "\nsubset_fake " << m << "\nk " << k << "\nn_logits " << n << "\nclasses " << classes << "\nsplits "
         << splits << "\n";
  }

  auto t0 = std::chrono::steady_clock::now();
  const MeanStd kid = kernel_inception_distance(real, fake, idx);
  const double t_kid = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const PrecisionRecall pr = precision_recall(real, fake, k);
  const double t_pr = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const MeanStd is = inception_score(logits, splits);
  const double t_is = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  const std::string cmd = python + " " SHARDGAN_SOURCE_DIR "/tests/feature_metrics_ref.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const double t_py = seconds_since(t0);
  std::map<std::string, double> ref;
  {
    std::ifstream f(dir / "ref.txt");
    std::string name;
    double value = 0.0;
    while (f >> name >> value) ref[name] = value;
  }
  ASSERT_EQ(ref.size(), 6u) << "ref.txt in " << dir;
  std::printf("C++: KID %.3fs, P/R %.3fs, IS %.3fs; Python %.3fs\n", t_kid, t_pr, t_is, t_py);

  const std::map<std::string, double> mine = {{"kid_mean", kid.mean}, {"kid_std", kid.std},
                                              {"precision", pr.precision}, {"recall", pr.recall},
                                              {"is_mean", is.mean}, {"is_std", is.std}};
  double worst = 0.0;
  for (const auto& [name, value] : mine) {
    const double r = ref.at(name), rel = std::abs(value - r) / std::abs(r);
    worst = std::max(worst, rel);
    std::printf("%-9s C++ %.17g  numpy %.17g  relative difference %.3g\n", name.c_str(), value, r, rel);
    EXPECT_LE(rel, 1e-6) << "MISMATCH " << name << ": C++ " << value << ", numpy " << r;
  }
  std::printf("largest relative difference %.3g\n", worst);
  // The metrics are not trivial: a clear KID, precision and recall away from 0 and 1.
  EXPECT_GT(kid.mean, 10.0 * kid.std / std::sqrt(static_cast<double>(subsets)));
  EXPECT_GT(pr.precision, 0.05);
  EXPECT_LT(pr.precision, 0.95);
  EXPECT_GT(pr.recall, 0.05);
  EXPECT_LT(pr.recall, 0.95);
  EXPECT_GT(is.mean, 1.5);
}

// Disjoint subsets of one sample: the unbiased estimate is near 0 (mean within a few
// standard errors), far below the KID of a shifted set.
TEST(FeatureMetrics, KidOfOneDistributionNearZero) {
  const at::Tensor x = normal(4000, 64, 11);
  KidSubsets idx = draw_kid_subsets(2000, 2000, 20, 1000, 3);
  idx.fake = idx.fake + 2000;  // the second half of the same array
  const MeanStd same = kernel_inception_distance(x, x, idx);
  const MeanStd shifted = kernel_inception_distance(x, x * 1.1f + 0.12f, idx);
  std::printf("KID same distribution %.3g +- %.3g, shifted %.3g +- %.3g\n", same.mean, same.std, shifted.mean,
              shifted.std);
  EXPECT_EQ(same.count, 20);
  EXPECT_LT(std::abs(same.mean), 0.02 * shifted.mean);
  EXPECT_LT(std::abs(same.mean), 3.0 * same.std);
}

// The seeded subsets: reproducible, distinct within a subset, in range, and seed-dependent.
TEST(FeatureMetrics, DrawnSubsets) {
  const KidSubsets a = draw_kid_subsets(50, 30, 4, 25, 9), b = draw_kid_subsets(50, 30, 4, 25, 9);
  const KidSubsets c = draw_kid_subsets(50, 30, 4, 25, 10);
  EXPECT_TRUE(a.real.equal(b.real));
  EXPECT_TRUE(a.fake.equal(b.fake));
  EXPECT_FALSE(a.real.equal(c.real));
  for (int64_t s = 0; s < 4; ++s) {
    const auto r = a.real[s].contiguous(), f = a.fake[s].contiguous();
    std::set<int64_t> rs(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + 25);
    std::set<int64_t> fs(f.data_ptr<int64_t>(), f.data_ptr<int64_t>() + 25);
    EXPECT_EQ(rs.size(), 25u);
    EXPECT_EQ(fs.size(), 25u);
    EXPECT_LT(*rs.rbegin(), 50);
    EXPECT_LT(*fs.rbegin(), 30);
    EXPECT_GE(*rs.begin(), 0);
  }
  // The convenience overload draws the same subsets.
  const at::Tensor x = normal(50, 8, 1), y = normal(30, 8, 2);
  const MeanStd direct = kernel_inception_distance(x, y, a), seeded = kernel_inception_distance(x, y, 4, 25, 9);
  EXPECT_EQ(direct.mean, seeded.mean);
  EXPECT_EQ(direct.std, seeded.std);
}

// Identical sets: every point lies in its own ball, so precision = recall = 1; far apart: 0.
TEST(FeatureMetrics, PrecisionRecallKnownAnswers) {
  const at::Tensor x = normal(500, 16, 5);
  const PrecisionRecall same = precision_recall(x, x, 3);
  EXPECT_EQ(same.precision, 1.0);
  EXPECT_EQ(same.recall, 1.0);
  const PrecisionRecall far = precision_recall(x, x + 100.0f, 3);
  EXPECT_EQ(far.precision, 0.0);
  EXPECT_EQ(far.recall, 0.0);
  // Four points on a line (0, 1, 3, 6), k = 1: radii 1, 1, 2, 3. Fakes at 7 (inside 6's
  // ball), 9 (on its boundary: inside), 9.5 (outside all): precision 2/3.
  const at::Tensor line = torch::tensor({0.0, 1.0, 3.0, 6.0}, torch::kDouble).unsqueeze(1);
  const at::Tensor probe = torch::tensor({7.0, 9.0, 9.5}, torch::kDouble).unsqueeze(1);
  EXPECT_DOUBLE_EQ(precision_recall(line, probe, 1).precision, 2.0 / 3.0);
  // The reference radii computed once (as evaluations cache them) give the same answers.
  const at::Tensor radii = manifold_radii_sq(line, 1);
  EXPECT_TRUE(radii.equal(torch::tensor({1.0, 1.0, 4.0, 9.0}, torch::kDouble))) << radii;
  EXPECT_DOUBLE_EQ(precision_recall(line, probe, radii, 1).precision, 2.0 / 3.0);
  const at::Tensor y = normal(300, 16, 6) * 1.2f;
  const PrecisionRecall plain = precision_recall(x, y, 3), cached = precision_recall(x, y, manifold_radii_sq(x, 3), 3);
  EXPECT_EQ(plain.precision, cached.precision);
  EXPECT_EQ(plain.recall, cached.recall);
  expect_invalid([&] { precision_recall(x, y, radii, 3); }, "real_radii_sq");
}

// Uniform logits: p(y|x) = p(y), IS = 1. Confident one-hot logits spread evenly over C
// classes in every split: KL = log C, IS = C.
TEST(FeatureMetrics, InceptionScoreKnownAnswers) {
  const MeanStd uniform = inception_score(torch::zeros({100, 1008}), 10);
  EXPECT_NEAR(uniform.mean, 1.0, 1e-12);
  EXPECT_NEAR(uniform.std, 0.0, 1e-12);
  const int64_t classes = 10;
  const at::Tensor labels = torch::arange(200, torch::kLong).remainder(classes);
  const at::Tensor onehot = torch::one_hot(labels, classes).to(torch::kDouble) * 100.0;
  const MeanStd confident = inception_score(onehot, 10);
  EXPECT_NEAR(confident.mean, static_cast<double>(classes), 1e-9);
  EXPECT_NEAR(confident.std, 0.0, 1e-9);
  EXPECT_EQ(confident.count, 10);
}

TEST(FeatureMetrics, RefusesBadInput) {
  const at::Tensor x = normal(40, 8, 1);
  const KidSubsets idx = draw_kid_subsets(40, 40, 2, 10, 1);
  expect_invalid([&] { kernel_inception_distance(x, normal(40, 9, 2), idx); }, "[40, 8], fake [40, 9]");
  expect_invalid([&] { kernel_inception_distance(x, x, 2, 1000, 0); }, "needs at least 1000 rows, got [40, 8]");
  expect_invalid([&] { kernel_inception_distance(torch::empty({0, 8}), x, idx); }, "[0, 8]");
  expect_invalid([&] { kernel_inception_distance(torch::zeros({40}), x, idx); }, "[40]");
  expect_invalid([&] { kernel_inception_distance(x.to(torch::kLong), x, idx); }, "Long [40, 8]");
  KidSubsets bad = idx;
  bad.fake = idx.fake.clone();
  bad.fake[1][3] = 40;
  expect_invalid([&] { kernel_inception_distance(x, x, bad); }, "fake subset 1 has index 40, outside [0, 40)");
  bad.fake[1][3] = bad.fake[1][4].item<int64_t>();
  expect_invalid([&] { kernel_inception_distance(x, x, bad); }, "fake subset 1 repeats index");
  bad.fake = idx.fake.slice(0, 0, 1);
  expect_invalid([&] { kernel_inception_distance(x, x, bad); }, "[2, 10] and [1, 10]");
  bad.fake = idx.fake.to(torch::kInt);
  expect_invalid([&] { kernel_inception_distance(x, x, bad); }, "int64 [S, m]");
  at::Tensor with_nan = x.clone();
  with_nan[3][2] = NAN;
  expect_invalid([&] { kernel_inception_distance(with_nan, x, idx); }, "non-finite");
  expect_invalid([&] { draw_kid_subsets(40, 30, 2, 35, 0); }, "subset_size 35");

  expect_invalid([&] { precision_recall(x, normal(40, 9, 2)); }, "real [40, 8], fake [40, 9]");
  expect_invalid([&] { precision_recall(x, normal(3, 8, 2), 3); }, "at least 4 rows, got [3, 8]");
  expect_invalid([&] { precision_recall(x, x, 0); }, "k must be >= 1");
  expect_invalid([&] { precision_recall(torch::zeros({2, 3, 4}), x); }, "[2, 3, 4]");

  expect_invalid([&] { inception_score(torch::zeros({5, 10}), 10); }, "at least 10 rows, got [5, 10]");
  expect_invalid([&] { inception_score(torch::zeros({5, 10}), 0); }, "splits must be >= 1");
  expect_invalid([&] { inception_score(torch::zeros({10}), 1); }, "[10]");
  expect_invalid([&] { inception_score(torch::full({20, 3}, INFINITY), 2); }, "non-finite");
}

}  // namespace SHARDGAN_UNITY_ID
