// The trained state of a job (model_set.h): the groups the models run on, the models, their
// optimizers, loss scalers and G's EMA.
#include "shardgan/train/model_set.h"

#include <filesystem>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/comm/hybrid_communicator.h"
#include "shardgan/optim/factory.h"
#include "shardgan/optim/offloaded_adam.h"
#include "shardgan/sharding/deferred.h"
#include "train/model_groups.h"

namespace shardgan {

ModelSet::ModelSet(const TrainConfig& cfg, Communicator& world, const ModelFamily& family)
    : cfg_(cfg), world_(world), family_(family) {
  // Split placement: a rank holds G or D.
  if (cfg_.placement == "split") {
    holds_g_ = make_split_placement();
    holds_d_ = !holds_g_;
  }
  // HSDP's replica groups and hpZ's secondary groups split the ranks a model runs on:
  // under split placement its group's (a collective over that group only, so each group
  // builds its own model's).
  Communicator& ranks = batch_comm();
  if (holds_g_) g_comm_ = hsdp_communicator(ranks, cfg_.g_replicate_degree, "generator", cfg_.source);
  if (holds_d_) d_comm_ = hsdp_communicator(ranks, cfg_.d_replicate_degree, "discriminator", cfg_.source);
  if (holds_g_) g_hpz_ = hpz_secondary_group(ranks, cfg_.g_sharding.hpz_partition_size, "generator", cfg_.source);
  if (holds_d_) d_hpz_ = hpz_secondary_group(ranks, cfg_.d_sharding.hpz_partition_size, "discriminator", cfg_.source);
}

ModelSet::~ModelSet() {
  // Explicit order: the EMA refers to G; the models go before the optimizers (with
  // parameter offload their units read the master shards from the optimizer, ShardSource;
  // an optimizer's destructor does not touch its model); the groups last.
  ema_.reset();
  g_.reset();
  d_.reset();
  opt_g_.reset();
  opt_d_.reset();
}

bool ModelSet::make_split_placement() {
  const int n = world_.world_size();
  const std::string where = cfg_.source + ": train.placement split on " + std::to_string(n) + " ranks: ";
  if (n < 2) throw ConfigError(where + "needs at least 2 ranks (one for G, one for D); use train.placement: shared");
  const int k = split_generator_ranks(cfg_, n);
  if (k >= n) {
    throw ConfigError(where + "placement.generator_ranks = " + fmt::format("{}", cfg_.generator_ranks) +
                      " leaves no rank for D; give G 1 to " + std::to_string(n - 1) + " ranks");
  }
  const int64_t micro = cfg_.global_batch / cfg_.micro_batches;
  if (micro % k != 0 || micro % (n - k) != 0) {
    throw ConfigError(where + "each micro-batch of " + std::to_string(micro) + " images (train.global_batch / " +
                      "train.micro_batches) must divide among G's " + std::to_string(k) + " ranks and D's " +
                      std::to_string(n - k) + " (set placement.generator_ranks or train.global_batch)");
  }
  check_split_group_divisors(cfg_, n, k);  // on every rank, before only a group's ranks split it
  const bool holds_g = world_.rank() < k;
  group_comm_ = world_.split(holds_g ? 0 : 1, world_.rank());
  const ImageShape shape = family_.image_shape();
  split_ = std::make_unique<SplitPlacement>(world_, *group_comm_, k, micro,
                                            std::vector<int64_t>{shape.channels, shape.height, shape.width},
                                            cfg_.g_sharding.compute_dtype.value_or(cfg_.model_dtype));
  if (world_.rank() == 0) {
    spdlog::info("split placement: G on ranks 0-{}, D on ranks {}-{}; {} images and their gradients cross per "
                 "micro-batch", k - 1, k, n - 1, micro);
  }
  return holds_g;
}

void ModelSet::build() {
  if (scaler_g_) throw std::logic_error("ModelSet::build called twice");
  // Deferred sharded initialization: each unit is built, initialized and sharded in turn.
  // SyncBatchNorm stays on the batch communicator; a model shards over its own (the
  // replica group's under HSDP, the group's under split).
  Communicator& ranks = batch_comm();
  if (holds_g_) {
    std::tie(g_, opt_g_) = build_model_and_optimizer(family_.generator(ranks), g_comm(), cfg_.g_sharding,
                                                     lazy_corrected(cfg_.g_optim, lazy_regularization_ratio(cfg_, true)),
                                                     cfg_.seed + 1);
  }
  if (holds_d_) {
    std::tie(d_, opt_d_) = build_model_and_optimizer(family_.discriminator(ranks), d_comm(), cfg_.d_sharding,
                                                     lazy_corrected(cfg_.d_optim, lazy_regularization_ratio(cfg_, false)),
                                                     cfg_.seed + 2);
  }
  if (g_ && g_hpz_) g_->set_secondary_group(g_hpz_.get());
  if (d_ && d_hpz_) d_->set_secondary_group(d_hpz_.get());
  at::Tensor numels = torch::tensor({g_ ? g_->numel() : 0, d_ ? d_->numel() : 0}, torch::kLong);
  if (split_) world_.all_reduce(numels, ReduceOp::kMax);
  g_numel_ = numels[0].item<int64_t>();
  d_numel_ = numels[1].item<int64_t>();
  auto compute = [&](const ShardingConfig& s) { return s.compute_dtype.value_or(cfg_.model_dtype); };
  scaler_g_ = std::make_unique<DynamicLossScaler>(cfg_.loss_scale, compute(cfg_.g_sharding));
  scaler_d_ = std::make_unique<DynamicLossScaler>(cfg_.loss_scale, compute(cfg_.d_sharding));
  if (cfg_.ema_enabled && g_) ema_ = std::make_unique<ShardedEma>(*g_, cfg_.ema);
}

std::pair<std::unique_ptr<ShardedModel>, std::unique_ptr<ShardedOptimizer>> ModelSet::build_model_and_optimizer(
    const ModelSpec& spec, Communicator& comm, const ShardingConfig& sc, const OptimizerConfig& oc, uint64_t seed) {
  OptimizerConfig resolved = oc;
  resolve_state_float32(resolved, spec.sparse_params);
  if (oc.offload.param == OffloadDevice::kNone) {
    auto model = build_sharded_model(spec, comm, sc, seed, cfg_.model_dtype, cfg_.compute_device);
    auto opt = make_optimizer(*model, resolved);
    return {std::move(model), std::move(opt)};
  }
  // Parameter offload: the optimizer's store first, then each unit's master shard into it
  // as the unit is built, so that a rank never holds all its master shards at once (they
  // are the size of the state offload exists to keep out of RAM).
  auto model = std::make_unique<ShardedModel>(spec.name, comm, sc);
  auto opt = std::make_unique<OffloadedAdam>(*model, adam_config(resolved), oc.offload,
                                             unit_shard_numels(spec, comm.world_size(), sc.stage, sc.flat_align), cfg_.model_dtype);
  opt->set_schedule(LrSchedule(resolved.lr, resolved.schedule));
  populate_sharded_model(*model, spec, seed, cfg_.model_dtype, cfg_.compute_device,
                         [&](ShardedUnit& u) { opt->adopt_unit(u); });
  return {std::move(model), std::move(opt)};
}

std::vector<ShardedModel*> ModelSet::held() {
  std::vector<ShardedModel*> out;
  for (ShardedModel* m : {g_.get(), d_.get()}) {
    if (m) out.push_back(m);
  }
  return out;
}

MemoryStats ModelSet::memory_stats(ShardedModel* m) const {
  if (!m) return {};
  MemoryStats s = m->memory_stats();
  ShardedOptimizer& o = *(m == g_.get() ? opt_g_ : opt_d_);  // const member: the pointee is not
  s.optimizer_state_bytes = o.state_bytes();
  s.offloaded_bytes = o.offloaded_bytes();
  return s;
}

ModelSetTimes ModelSet::times() const {
  ModelSetTimes t;
  for (auto [m, o] : {std::pair{g_.get(), opt_g_.get()}, std::pair{d_.get(), opt_d_.get()}}) {
    if (!m) continue;  // split placement: the other group's model
    const CommTimes& c = m->comm_times();
    t.collective_s += c.collective_s;
    t.offload_read_s += c.offload_read_s;
    t.optimizer_s += o->update_seconds();
    t.optimizer_io_s += o->update_io_seconds();
    t.offload_grad_s += c.offload_grad_s;
  }
  return t;
}

ModelSetCommBytes ModelSet::comm_bytes() const {
  auto bytes = [](const CommStats& s) {
    return s.all_gather_bytes + s.reduce_scatter_bytes + s.all_reduce_bytes + s.broadcast_bytes + s.all_to_all_bytes;
  };
  ModelSetCommBytes b;
  b.world = bytes(world_.stats());
  for (Communicator* c : {g_comm_.get(), d_comm_.get()}) {
    if (!c) continue;
    auto& h = static_cast<HybridCommunicator&>(*c);
    b.shard_group += bytes(h.stats());
    b.replicate += bytes(h.replicate_group().stats());
  }
  for (Communicator* c : {g_hpz_.get(), d_hpz_.get()}) {
    if (c) b.secondary += bytes(c->stats());
  }
  return b;
}

std::vector<ModelAndOptimizer> ModelSet::checkpoint_models() {
  // Split placement: a rank passes the model it holds, led by its group's lowest rank.
  const int d_leader = split_ ? split_->generator_ranks() : 0;
  std::vector<ModelAndOptimizer> out;
  if (g_) {
    ModelAndOptimizer g{g_.get(), opt_g_.get()};
    if (ema_) g.extra.push_back({"ema", [this](size_t i) { return ema_->unit_shard(i); }});
    out.push_back(std::move(g));
  }
  if (d_) out.push_back({d_.get(), opt_d_.get(), {}, d_leader});
  return out;
}

void ModelSet::put_scaler_state(std::map<std::string, double>& scalars) const {
  for (auto& [k, v] : scaler_g_->state()) scalars["g." + k] = v;
  for (auto& [k, v] : scaler_d_->state()) scalars["d." + k] = v;
}

void ModelSet::load_scaler_state(const std::map<std::string, double>& scalars) {
  for (auto [prefix, scaler] : {std::pair{"g.", scaler_g_.get()}, std::pair{"d.", scaler_d_.get()}}) {
    std::vector<std::pair<std::string, double>> st;
    for (auto& [k, v] : scalars) {
      if (k.rfind(prefix, 0) == 0) st.emplace_back(k.substr(2), v);
    }
    scaler->load_state(st);
  }
}

std::vector<at::Tensor> ModelSet::clone_buffers() {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (ShardedModel* m : held()) {
    for (auto& kv : m->named_buffers()) out.push_back(kv.second.clone());
  }
  return out;
}

void ModelSet::abandon_step(const std::vector<at::Tensor>& buffers) {
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (ShardedModel* m : held()) {
    m->abandon_step();
    for (auto& kv : m->named_buffers()) kv.second.copy_(buffers.at(i++));
  }
}

}  // namespace shardgan
