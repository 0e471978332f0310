#include "shardgan/train/inference.h"

#include <algorithm>
#include <filesystem>

#include <torch/torch.h>

#include "shardgan/data/edges.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/images.h"
#include "shardgan/data/paired_folder.h"
#include "shardgan/sharding/deferred.h"
#include "shardgan/train/image_grid.h"

namespace shardgan {
namespace {

TrainConfig generator_config(const std::string& yaml, const std::string& where) {
  TrainConfig cfg = parse_config(yaml, where, {});
  cfg.g_sharding.stage = 0;
  return cfg;
}

std::unique_ptr<ShardedModel> build_stored_generator(const TrainConfig& cfg, Communicator& comm) {
  return build_sharded_model(cfg.family->generator(comm), comm, cfg.g_sharding, cfg.seed + 1, cfg.model_dtype);
}

}  // namespace

std::unique_ptr<ShardedModel> load_generator(ckpt::CheckpointReader& rd, Communicator& comm, bool ema,
                                             TrainConfig* cfg_out) {
  const ckpt::Manifest& m = rd.manifest();
  TrainConfig cfg = generator_config(m.config, rd.dir() + "/index.h5 (stored config)");
  auto g = build_stored_generator(cfg, comm);
  const ckpt::ModelEntry* me = m.model(g->name());
  if (!me) throw CheckpointError("checkpoint '" + rd.dir() + "' holds no generator");
  const std::string kind = ema ? "ema" : "param_shard";
  if (ema && std::find(me->extras.begin(), me->extras.end(), "ema") == me->extras.end()) {
    throw CheckpointError("checkpoint '" + rd.dir() + "' holds no EMA of the generator (trained without one); drop --ema");
  }
  if (me->units.size() != g->units().size()) throw CheckpointError("checkpoint '" + rd.dir() + "': generator units differ from its config");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < g->units().size(); ++i) {
    ShardedUnit& u = *g->units()[i];
    const ckpt::UnitEntry& ue = me->units[i];
    if (ue.numel != u.numel() || ue.params.size() != u.slots().size() || !u.shard().is_contiguous()) {
      throw CheckpointError("checkpoint '" + rd.dir() + "': generator unit '" + u.name() + "' differs from its config");
    }
    if (std::string(h5::dtype_name(ckpt::parse_dtype(me->dtype))) !=
        (u.shard().scalar_type() == at::kDouble ? "float64" : "float32")) {
      throw CheckpointError("checkpoint '" + rd.dir() + "': generator dtype " + me->dtype + " differs from its config");
    }
    // Parameter by parameter, from its place in the checkpoint's flat layout to its place
    // here (the two differ when one side aligns the parameters).
    for (size_t k = 0; k < u.slots().size(); ++k) {
      const auto& s = u.slots()[k];
      if (ue.params[k].name != s.name || ue.params[k].numel != s.numel) {
        throw CheckpointError("checkpoint '" + rd.dir() + "': generator parameter '" + u.name() + "." + s.name +
                              "' differs from its config");
      }
      at::Tensor tmp = torch::empty({s.numel}, u.shard().options());
      rd.read_flat(*me, ue, kind, ue.params[k].offset, ue.params[k].offset + s.numel, tmp.data_ptr());
      u.shard().narrow(0, s.offset, s.numel).copy_(tmp);
    }
  }
  for (auto& [bname, buf] : g->named_buffers()) {
    const ckpt::BufferEntry* be = nullptr;
    for (const auto& b : me->buffers) {
      if (b.name == bname) be = &b;
    }
    if (!be) throw CheckpointError("checkpoint '" + rd.dir() + "' has no buffer 'generator." + bname + "'");
    at::Tensor c = torch::empty(buf.sizes(), buf.options());
    rd.read_dataset(be->rank, "generator/buffers/" + bname, c.data_ptr(), c.numel());
    buf.copy_(c);
  }
  g->after_optimizer_step();
  if (cfg_out) *cfg_out = cfg;
  return g;
}

std::shared_ptr<torch::nn::Module> plain_module(ShardedModel& m) {
  auto root = std::make_shared<torch::nn::Module>("ShardganGenerator");
  for (auto& u : m.units()) {
    // The units own their modules as shared_ptr<Module>; register the same objects.
    root->register_module(u->name(), std::shared_ptr<torch::nn::Module>(u->module().shared_from_this()));
  }
  return root;
}

void export_model(ShardedModel& m, const std::string& config_yaml, const std::string& path) {
  torch::serialize::OutputArchive ar;
  plain_module(m)->save(ar);
  ar.write("shardgan.config", c10::IValue(config_yaml));
  const std::string tmp = path + ".tmp";
  ar.save_to(tmp);
  std::filesystem::rename(tmp, path);
}

std::unique_ptr<ShardedModel> load_exported_generator(const std::string& path, Communicator& comm,
                                                      TrainConfig* cfg_out) {
  torch::serialize::InputArchive ar;
  ar.load_from(path);
  c10::IValue v;
  if (!ar.try_read("shardgan.config", v) || !v.isString()) {
    throw CheckpointError("'" + path + "' is not a shardgan export (no shardgan.config entry)");
  }
  TrainConfig cfg = generator_config(v.toStringRef(), path + " (stored config)");
  auto g = build_stored_generator(cfg, comm);
  // torch::load replaces the parameters' storage (Tensor::set_), which would detach them
  // from the flat buffer; load into a scratch copy and copy the values over instead.
  auto scratch = build_stored_generator(cfg, comm);
  plain_module(*scratch)->load(ar);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < g->units().size(); ++i) {
    ShardedUnit& u = *g->units()[i];
    const auto& from = scratch->units()[i]->slots();
    for (size_t j = 0; j < u.slots().size(); ++j) {
      const auto& s = u.slots()[j];
      u.shard().narrow(0, s.offset, s.numel).copy_(from[j].param.reshape({-1}));
    }
  }
  auto dst = g->named_buffers(), src = scratch->named_buffers();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second.copy_(src[i].second);
  g->after_optimizer_step();
  if (cfg_out) *cfg_out = cfg;
  return g;
}

at::Tensor fixed_latents(const TrainConfig& cfg, int64_t n, double truncation) {
  auto gen = at::detail::createCPUGenerator(cfg.seed + 4);
  return cfg.family->sample_truncated_latents(n, gen, cfg.model_dtype, truncation);
}

at::Tensor synthetic_images(const TrainConfig& cfg, int64_t n, uint64_t seed) {
  const ImageShape shape = cfg.family->image_shape();
  at::Tensor x = make_synthetic_images(n, seed, cfg.model_dtype);
  if (shape.height != x.size(2) || shape.width != x.size(3)) {
    x = torch::nn::functional::interpolate(
        x, torch::nn::functional::InterpolateFuncOptions()
               .size(std::vector<int64_t>{shape.height, shape.width})
               .mode(torch::kBilinear).align_corners(false));
  }
  return shape.channels == 1 ? x : x.repeat({1, shape.channels, 1, 1}).contiguous();
}

at::Tensor held_out_images(const TrainConfig& cfg, int64_t n) {
  n = std::min<int64_t>(n, 10000);
  if (cfg.data_source == "fashion-mnist") return load_fashion_mnist(cfg.data_path, cfg.model_dtype, "t10k").narrow(0, 0, n);
  if (cfg.data_source == "hdf5" || cfg.data_source == "paired") {
    return load_fashion_mnist(cfg.eval_reference, cfg.model_dtype, "t10k").narrow(0, 0, n);
  }
  return synthetic_images(cfg, n, cfg.seed + 21);
}

at::Tensor sample_grid(const TensorList& inputs, const at::Tensor& out) {
  at::Tensor o = out.to(at::kCPU, at::kFloat);
  if (inputs.size() < 3 || !inputs[2].defined()) return o;
  const at::Tensor a = inputs[1].to(at::kCPU, at::kFloat).expand({o.size(0), o.size(1), o.size(2), o.size(3)});
  const at::Tensor b = inputs[2].to(at::kCPU, at::kFloat);
  return torch::stack({a, o, b}, 1).flatten(0, 1);  // A0 G(A0) B0 A1 ...
}

TensorList fixed_sample_inputs(const TrainConfig& cfg, int* nrow, double truncation) {
  constexpr int kPerRow = 8;
  if (nrow) *nrow = kPerRow;
  if (cfg.family->condition_channels() > 0) {
    constexpr int64_t kPairs = 32;
    if (nrow) *nrow = 12;
    at::Tensor a, b;
    if (cfg.data_source == "hdf5") {  // no test split: the file's first pairs
      const data::Hdf5Dataset ds(cfg.data_path);
      const at::Tensor idx = torch::arange(std::min<int64_t>(kPairs, ds.size()), torch::kLong);
      ds.read(idx, cfg.model_dtype, &b, nullptr);
      a = ds.read_condition(idx, cfg.model_dtype);
    } else if (cfg.data_source == "paired") {  // no test split: the folder's first pairs
      const ImageShape s = cfg.family->image_shape();
      const data::PairedImages p = data::read_paired_folder(cfg.data_path, s.height, s.channels, kPairs);
      a = data::scale_pixels(p.a, cfg.model_dtype);
      b = data::scale_pixels(p.b, cfg.model_dtype);
    } else {
      b = held_out_images(cfg, kPairs);
      a = data::sobel_edges(b, cfg.family->condition_channels());
    }
    return {fixed_latents(cfg, b.size(0), truncation), a, b};  // truncation > 0 throws: seeds, not Gaussian
  }
  const int64_t classes = cfg.family->num_classes();
  if (classes == 0) return {fixed_latents(cfg, kPerRow * kPerRow, truncation), at::Tensor()};
  return {fixed_latents(cfg, classes * kPerRow, truncation), class_grid_labels(classes, kPerRow)};
}

}  // namespace shardgan
