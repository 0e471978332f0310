// shardgan-ckpt: inspect, verify, convert and sample sharded checkpoints. Needs no MPI
// runtime (no mpirun, no MPI_Init): models are built on a LocalCommunicator.
//   shardgan-ckpt ls DIR | info DIR | verify DIR | diff A B [--rtol X]
//   shardgan-ckpt consolidate DIR -o FULL.h5 | reshard DIR -o NEW --world-size M [--stage S]
//   shardgan-ckpt sample DIR -o grid.png [--ema] [-n 64] [--truncation T] | export DIR -o g.pt [--ema]
//   shardgan-ckpt fid DIR [--ema] [-n 10000] [--classifier runs/fmnist-classifier.h5] [--truncation T]
//                 [--feature-network inception.pt] [--reference DIR|FILE.h5] [--reference-samples N]
// DIR is a checkpoint directory, a checkpoints folder or a run directory (the newest
// committed checkpoint there). Exit status: 0 fine, 1 a bad checkpoint or a failed check,
// 2 bad usage.
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/checkpoint/offline.h"
#include "shardgan/checkpoint/shard_io.h"
#include "shardgan/comm/local_communicator.h"
#include "shardgan/models/family.h"
#include "shardgan/train/evaluation.h"
#include "shardgan/train/image_grid.h"
#include "shardgan/train/inference.h"

using namespace shardgan;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int cmd_ls(ckpt::CheckpointReader& rd) {
  std::printf("%-52s %-18s %-8s %10s  %s\n", "tensor", "shape", "dtype", "bytes", "held by (rank: elements)");
  int64_t total = 0;
  for (const auto& t : rd.tensors()) {
    const int64_t bytes = t.numel() * h5::dtype_bytes(ckpt::parse_dtype(t.dtype));
    total += bytes;
    std::string who;
    for (auto [r, a, b] : rd.holders(t)) {
      who += (who.empty() ? "" : ", ") + std::to_string(r) + ": [" + std::to_string(a) + ", " + std::to_string(b) + ")";
    }
    std::printf("%-52s %-18s %-8s %10lld  %s\n", t.path.c_str(), shape_str(t.shape).c_str(), t.dtype.c_str(),
                static_cast<long long>(bytes), who.c_str());
  }
  std::printf("%zu tensors, %lld bytes, %lld rank files\n", rd.tensors().size(), static_cast<long long>(total),
              static_cast<long long>(rd.manifest().files.size()));
  return 0;
}

int cmd_info(ckpt::CheckpointReader& rd) {
  const ckpt::Manifest& m = rd.manifest();
  std::printf("checkpoint      %s\nschema version  %lld\nstep            %lld\nepoch           %lld\n"
              "batch in epoch  %lld\nworld size      %lld\n",
              rd.dir().c_str(), (long long)m.schema_version, (long long)m.step, (long long)m.epoch,
              (long long)m.batch_in_epoch, (long long)m.world_size);
  for (const auto& mo : m.models) {
    int64_t params = 0, n = 0;
    for (const auto& u : mo.units) {
      params += u.numel;
      n += static_cast<int64_t>(u.params.size());
    }
    std::string states;
    for (const auto& k : ckpt::state_kinds(mo)) states += (states.empty() ? "" : ", ") + k;
    for (const auto& k : mo.raw_states) {
      states += ", optim/" + k + " (8-bit, blocks of " + std::to_string(mo.raw_state_block) + ")";
    }
    std::printf("%-15s stage %d, %s, %lld parameters in %lld tensors and %zu units, optimizer step %lld, states: %s\n",
                mo.name.c_str(), mo.stage, mo.dtype.c_str(), (long long)params, (long long)n, mo.units.size(),
                (long long)mo.optim_step, states.c_str());
  }
  for (const auto& [k, v] : m.scalars) std::printf("scalar %-8s %.17g\n", k.c_str(), v);
  int64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  std::printf("rank files      %zu, %lld bytes\nconfig:\n%s", m.files.size(), (long long)bytes, m.config.c_str());
  return 0;
}

int cmd_verify(ckpt::CheckpointReader& rd) {
  const auto problems = rd.verify_all();
  for (const auto& p : problems) std::fprintf(stderr, "CORRUPT: %s\n", p.c_str());
  if (!problems.empty()) {
    std::fprintf(stderr, "%s: %zu problem(s); do not resume from it\n", rd.dir().c_str(), problems.size());
    return 1;
  }
  int64_t datasets = 0, bytes = 0;
  for (const auto& f : rd.manifest().files) {
    datasets += static_cast<int64_t>(f.datasets.size());
    bytes += f.bytes;
  }
  std::printf("OK: %s: %zu rank files (%lld bytes), %lld datasets, every checksum matches, every tensor complete\n",
              rd.dir().c_str(), rd.manifest().files.size(), (long long)bytes, (long long)datasets);
  return 0;
}

int cmd_diff(const std::string& a, const std::string& b, double rtol) {
  const auto diffs = ckpt::diff(a, b);
  std::printf("%-52s %10s %12s %12s  %s\n", "tensor", "numel", "max abs", "max rel", "note");
  double worst = 0;
  bool mismatch = false;
  for (const auto& d : diffs) {
    std::printf("%-52s %10lld %12.4g %12.4g  %s\n", d.path.c_str(), (long long)d.numel, d.max_abs, d.max_rel,
                d.note.c_str());
    worst = std::max(worst, d.max_rel);
    mismatch = mismatch || d.note == "only in A" || d.note == "only in B" || d.note == "shape differs" ||
               d.note.find("non-finite") != std::string::npos;  // NaN against NaN is no match either
  }
  std::printf("max rel difference %.4g over %zu tensors\n", worst, diffs.size());
  if (rtol >= 0 && (worst > rtol || mismatch)) {
    std::fprintf(stderr, "shardgan-ckpt diff: differences exceed --rtol %g\n", rtol);
    return 1;
  }
  return 0;
}

int cmd_sample(ckpt::CheckpointReader& rd, const std::string& out, bool ema, int64_t n, bool eval, double truncation) {
  LocalCommunicator comm;
  TrainConfig cfg;
  auto g = load_generator(rd, comm, ema, &cfg);
  torch::NoGradGuard no_grad;
  g->train(!eval);  // the trainer samples in train mode (batch statistics), as DCGAN does
  // A conditional family gets the trainer's grid (one class per row), an image-to-image one its
  // held-out triples A | G(A) | B; else n latents.
  int nrow = 8;
  const bool fixed = cfg.family->num_classes() > 0 || cfg.family->condition_channels() > 0;
  TensorList in = fixed ? fixed_sample_inputs(cfg, &nrow, truncation)
                        : TensorList{fixed_latents(cfg, n, truncation), at::Tensor()};
  at::Tensor imgs = sample_grid(in, g->forward(in).at(0));
  write_png_grid(out, imgs, nrow);
  std::printf("wrote %s: %lld samples of the %s at step %lld\n", out.c_str(), (long long)imgs.size(0),
              ema ? "generator's EMA" : "generator", (long long)rd.manifest().step);
  return 0;
}

int cmd_export(ckpt::CheckpointReader& rd, const std::string& out, bool ema) {
  LocalCommunicator comm;
  auto g = load_generator(rd, comm, ema);
  export_model(*g, rd.manifest().config, out);
  std::printf("wrote %s: the %s at step %lld (torch::load it into plain_module(...) of the stored config's generator)\n",
              out.c_str(), ema ? "generator's EMA" : "generator", (long long)rd.manifest().step);
  return 0;
}

// FID (and class accuracy) of the checkpoint's G or EMA, as the trainer's evaluation
// computes it (evaluation.h) on one process; prints one JSON object.
// Overrides of the stored config's eval.* keys; empty or 0: keep the stored value.
struct EvalOverrides {
  std::string classifier, reference, feature_network;
  int64_t reference_samples = 0;
  std::string pr_network;
};

int cmd_fid(ckpt::CheckpointReader& rd, bool ema, int64_t n, const EvalOverrides& o, bool identity,
            double truncation) {
  torch::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  LocalCommunicator comm;
  TrainConfig cfg;
  auto g = load_generator(rd, comm, ema, &cfg);
  cfg.eval_samples = n;
  if (!o.classifier.empty()) {
    cfg.eval_features = "classifier";
    cfg.eval_classifier = o.classifier;
  }
  if (!o.reference.empty()) cfg.eval_reference = o.reference;
  if (!o.feature_network.empty()) {
    cfg.eval_features = "torchscript";
    cfg.eval_feature_network = o.feature_network;
  }
  if (o.reference_samples > 0) cfg.eval_reference_samples = o.reference_samples;
  if (!o.pr_network.empty()) cfg.eval_pr_feature_network = o.pr_network;
  g->train(true);  // as the trainer samples and evaluates: batch statistics
  Evaluator evaluator(cfg, comm, *cfg.family);
  if (identity && cfg.family->condition_channels() == 0) {
    std::fprintf(stderr, "shardgan-ckpt eval: --identity needs an image-to-image checkpoint (model.arch pix2pix); "
                         "%s holds model.arch %s\n", rd.dir().c_str(), cfg.family->arch());
    return 2;
  }
  const EvalResult r = evaluator.evaluate(*g, identity, truncation);
  nlohmann::json j = {{"checkpoint", rd.dir()}, {"step", rd.manifest().step}, {"ema", ema},
                      {"samples", r.samples}, {"time_s", r.time_s}};
  if (cfg.eval_features == "classifier") j["classifier"] = cfg.eval_classifier;
  put_scores(j, r);  // the trainer's evaluation keys
  if (r.truncation > 0) j["truncation"] = r.truncation;
  if (identity) j["identity"] = true;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardgan-ckpt: inspect, verify, convert and sample shardgan checkpoints"};
  app.require_subcommand(1);
  std::string dir, dir_b, out, pr_network;
  double rtol = -1;
  int world = 0, stage = -1;
  int64_t n = 64, fid_n = 10000;
  double truncation = 0;  // BigGAN's truncation trick: 0 = off
  std::string classifier, reference, feature_network;
  int64_t reference_samples = 0;
  bool ema = false, eval = false;
  auto* ls = app.add_subcommand("ls", "tensors: shapes, dtypes, bytes, which ranks hold them");
  auto* info = app.add_subcommand("info", "step, world size, stages, config");
  auto* verify = app.add_subcommand("verify", "checksums and completeness (exit 1 on any problem)");
  auto* diff = app.add_subcommand("diff", "per-tensor max abs and rel difference of A and B");
  auto* cons = app.add_subcommand("consolidate", "one HDF5 file of full tensors (streamed)");
  auto* resh = app.add_subcommand("reshard", "a copy laid out for another world size (offline)");
  auto* sample = app.add_subcommand("sample", "PNG grid from G (or its EMA), built from the stored config");
  auto* exp = app.add_subcommand("export", "G (or its EMA) as a file torch::load reads");
  auto* fid = app.add_subcommand("fid", "FID (and class accuracy) of G or its EMA, as one JSON line");
  auto* evl = app.add_subcommand("eval", "as fid; image-to-image models add L1, PSNR and SSIM on held-out pairs");
  bool identity = false;
  evl->add_flag("--identity", identity, "image-to-image: score the input images A themselves (the B ~ A baseline)");
  for (auto* sc : {ls, info, verify, diff, cons, resh, sample, exp, fid, evl}) {
    sc->add_option("checkpoint", dir, "checkpoint directory, checkpoints folder or run directory")->required();
  }
  diff->add_option("other", dir_b, "second checkpoint")->required();
  diff->add_option("--rtol", rtol,
                   "exit 1 if any tensor's max rel difference exceeds this, a tensor is on one side only or "
                   "differs in shape, or either side holds a NaN or an infinity");
  for (auto* sc : {cons, resh, sample, exp}) sc->add_option("-o,--output", out, "output path")->required();
  resh->add_option("--world-size", world, "new number of ranks")->required()->check(CLI::PositiveNumber);
  resh->add_option("--stage", stage, "new ZeRO stage for every model (default: keep)")->check(CLI::Range(0, 3));
  for (auto* sc : {sample, exp, fid, evl}) sc->add_flag("--ema", ema, "use the generator's EMA weights");
  for (auto* sc : {fid, evl}) {
    sc->add_option("-n,--count", fid_n, "generated images (default 10000; image-to-image: held-out pairs, at most 10000)")
        ->check(CLI::Range(int64_t{2}, int64_t{10000000}));
    sc->add_option("--classifier", classifier, "score on this classifier file (default: the stored config's "
                   "eval.features and its file)");
    sc->add_option("--reference", reference,
                   "the real images: a Fashion-MNIST folder (its t10k split) or an HDF5 file from shardgan-data convert");
    sc->add_option("--feature-network", feature_network,
                   "score on this TorchScript feature network (scripts/export_inception.py) instead of the classifier");
    sc->add_option("--pr-network", pr_network, "precision and recall alone on this TorchScript network, such as "
                   "VGG16 (scripts/export_vgg16.py, or NVIDIA's vgg16.pt; default: the stored config's "
                   "eval.pr_feature_network)");
    sc->add_option("--reference-samples", reference_samples, "at most this many reference images (default: the "
                   "stored config's eval.reference_samples)")->check(CLI::Range(int64_t{2}, int64_t{10000000}));
    sc->add_option("--truncation", truncation,
                   "redraw latents with |z| above this (BigGAN's truncation trick), or for model.arch "
                   "stylegan2 the truncation psi in W; 0: off")
        ->check(CLI::NonNegativeNumber);
  }
  sample->add_option("--truncation", truncation,
                     "redraw latents with |z| above this (BigGAN's truncation trick), or for model.arch stylegan2 "
                     "the truncation psi in W")
      ->check(CLI::NonNegativeNumber);
  sample->add_option("-n,--count", n, "number of samples (64 = the trainer's fixed grid)")->check(CLI::PositiveNumber);
  sample->add_flag("--eval", eval, "BatchNorm running statistics instead of batch statistics");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    torch::set_num_threads(1);
    const std::string d = resolve_checkpoint_dir(dir, "checkpoint");
    if (*diff) return cmd_diff(d, resolve_checkpoint_dir(dir_b, "checkpoint"), rtol);
    ckpt::CheckpointReader rd(d);
    if (*ls) return cmd_ls(rd);
    if (*info) return cmd_info(rd);
    if (*verify) return cmd_verify(rd);
    if (*cons) {
      ckpt::consolidate(d, out);
      std::printf("wrote %s: %zu full tensors of step %lld\n", out.c_str(), rd.tensors().size(),
                  (long long)rd.manifest().step);
      return 0;
    }
    if (*resh) {
      ckpt::reshard(d, out, world, stage);
      std::printf("wrote %s: step %lld for %d ranks\n", out.c_str(), (long long)rd.manifest().step, world);
      return 0;
    }
    if (*sample) return cmd_sample(rd, out, ema, n, eval, truncation);
    if (*exp) return cmd_export(rd, out, ema);
    const EvalOverrides o{classifier, reference, feature_network, reference_samples, pr_network};
    if (*fid) return cmd_fid(rd, ema, fid_n, o, false, truncation);
    if (*evl) return cmd_fid(rd, ema, fid_n, o, identity, truncation);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardgan-ckpt: error: %s\n", e.what());
    return 1;
  }
  return 2;
}
