// The offload section of the training configuration (config_sections.h): the disk tier's
// folder and streaming ring, shared by both models, and what each model offloads.
#include <stdexcept>
#include <tuple>

#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

// offload.path and the ring settings are shared; offload.<model>.{optimizer,param} are not.
void read_offload(Reader& r, TrainConfig& c) {
  OffloadConfig shared;
  shared.path = r.get<std::string>(
      "offload.path", "", "folder for the disk tier's files, one per rank and model (empty: <run.dir>/offload)");
  shared.buffer_bytes = r.get<int64_t>("offload.buffer_bytes", shared.buffer_bytes,
      "bytes of one streaming buffer of the offload ring");
  require(shared.buffer_bytes >= (int64_t{1} << 20) && shared.buffer_bytes <= (int64_t{1} << 34) &&
              shared.buffer_bytes % 4096 == 0,
          r, "offload.buffer_bytes", "must be a multiple of 4096 from 1048576 (1 MiB) to 17179869184 (16 GiB)");
  shared.buffer_count = r.get<int64_t>("offload.buffer_count", shared.buffer_count,
      "buffers in the offload ring; the disk tier's RAM is at most buffer_count x buffer_bytes");
  require(shared.buffer_count >= 2 && shared.buffer_count <= 64, r, "offload.buffer_count", "must be 2 to 64");
  shared.queue_depth = r.get<int64_t>("offload.queue_depth", shared.queue_depth, "io_uring submission queue entries");
  require(shared.queue_depth >= 1 && shared.queue_depth <= 4096, r, "offload.queue_depth", "must be 1 to 4096");
  shared.overlap_copies = r.get<bool>("offload.overlap_copies", shared.overlap_copies,
      "with shards on a GPU: overlap device-host copies with the CPU Adam step (same bits)");
  shared.copy_block_bytes = r.get<int64_t>("offload.copy_block_bytes", shared.copy_block_bytes,
      "bytes of one overlapped copy block");
  require(shared.copy_block_bytes >= 4096 && shared.copy_block_bytes <= (int64_t{1} << 34) &&
              shared.copy_block_bytes % 4096 == 0,
          r, "offload.copy_block_bytes", "must be a multiple of 4096 from 4096 to 17179869184 (16 GiB)");
  for (auto [who, oc, sc] : {std::tuple{"generator", &c.g_optim, &c.g_sharding},
                             std::tuple{"discriminator", &c.d_optim, &c.d_sharding}}) {
    OffloadConfig o = shared;
    const std::string w = who;
    for (auto [what, dst] : {std::pair{"optimizer", &o.optimizer}, std::pair{"param", &o.param},
                             std::pair{"gradient", &o.gradient}}) {
      const std::string key = "offload." + w + "." + what;
      try {
        *dst = parse_offload_device(r.get<std::string>(
            key, "none", "offload this model's optimizer state / master parameters / reduced gradient shards: none, cpu or disk"));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(r.source() + ": key '" + key + "' " + e.what());
      }
    }
    require(o.optimizer == OffloadDevice::kNone || oc->type == OptimizerType::kAdam || oc->type == OptimizerType::kAdamW,
            r, "offload." + w + ".optimizer",
            "needs optim." + w + ".type adam or adamw: the offloaded step is the fused CPU Adam");
    {
      const std::string key = "offload." + w + ".gradient_dtype";
      try {
        o.gradient_dtype = parse_offload_grad_dtype(r.get<std::string>(
            key, "master", "offloaded gradient shards in the master dtype (master) or in bfloat16 (half the bytes)"));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(r.source() + ": key '" + key + "' " + e.what());
      }
      const bool bf16 = o.gradient_dtype == OffloadGradDtype::kBFloat16;
      require(!bf16 || o.gradient != OffloadDevice::kNone, r, key,
              "bfloat16 needs offload." + w + ".gradient cpu or disk: it is the dtype of offloaded gradient shards");
      require(!bf16 || c.model_dtype == at::kFloat, r, key, "bfloat16 needs model.dtype float32");
    }
    require(oc->state.dtype == StateDtype::kFloat32 || c.model_dtype == at::kFloat,
            r, "optim." + w + ".state_dtype",
            "bfloat16 and int8 states need model.dtype float32 (the fused CPU kernels step float32 shards)");
    require(o.param == OffloadDevice::kNone || sc->stage == 3, r, "offload." + w + ".param",
            "needs sharding." + w + ".stage 3: parameter offload moves parameter shards, which only stage 3 keeps");
    require(o.param == OffloadDevice::kNone || o.param == o.optimizer, r, "offload." + w + ".param",
            "needs offload." + w + ".optimizer on the same device (" + to_string(o.param) +
                "): the master shard and its Adam moments share one store");
    require(o.gradient == OffloadDevice::kNone || sc->stage >= 2, r, "offload." + w + ".gradient",
            "needs sharding." + w + ".stage 2 or 3: gradient offload moves gradient shards, which stages 0 and 1 do not keep");
    require(o.gradient == OffloadDevice::kNone || o.gradient == o.optimizer, r, "offload." + w + ".gradient",
            "needs offload." + w + ".optimizer on the same device (" + to_string(o.gradient) +
                "): the offloaded Adam step reads the gradient beside its moments");
    oc->offload = o;
  }
}

}  // namespace shardgan::config_sections
