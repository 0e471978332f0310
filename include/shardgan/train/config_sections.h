#pragma once
/// The config reader's sections, one function per part of a section, each defined in the
/// file of its section (src/train/config_<section>.cpp). For parse_config and
/// config_reference_markdown only; other callers use parse_config (config.h).
///
/// Every function reads its keys from `r` (ConfigReader::get, which records them for the
/// reference) into `c`, checks them with ConfigReader::require (throwing ConfigError naming
/// the file and the key), and records keys set that the resolved config ignores with
/// ConfigReader::warn_if_ignored. Local; no MPI. read_config calls them in one fixed order,
/// the order in which the keys were always read: it is the order of TrainConfig::
/// resolved_yaml (stored in checkpoints) and of docs/config.md, and which of two bad keys is
/// named first. A section read in several parts (train.*) has a function per part.
#include <string>

#include "shardgan/train/config.h"
#include "shardgan/util/config_reader.h"

namespace shardgan::config_sections {

using Reader = ConfigReader;

/// r.require(ok, key, what): throws ConfigError naming the file and `key` unless `ok`.
inline void require(bool ok, Reader& r, const std::string& key, const std::string& what) {
  r.require(ok, key, what);
}

/// config.cpp: every section below in order, then ConfigReader::check_all_known; fills
/// resolved_yaml, resolved_nested_yaml and warnings. `source` names the file in messages.
TrainConfig read_config(Reader& r, const std::string& source);

// config_run.cpp
void read_run(Reader& r, TrainConfig& c);    ///< run.dir, seed, device, tf32, deterministic
void read_data(Reader& r, TrainConfig& c);   ///< data.source, path, synthetic_size, prefetch_batches
/// model.dtype, then model.arch and its family's model.* keys (make_family, models/family.h).
void read_model(Reader& r, TrainConfig& c);

// config_train.cpp
/// train.steps, global_batch, micro_batches, log_every, sample_every, checkpoint_every,
/// keep_checkpoints, final_checkpoint, threads.
void read_train_loop(Reader& r, TrainConfig& c);
/// train.d_steps, d_joint_pass, update, shared_d_forward (warns when set under the
/// alternating update) and placement, then the placement.* keys (read_placement). Needs
/// read_model.
void read_train_update(Reader& r, TrainConfig& c);
/// train.loss, l1_weight, adversarial_weight, aux_class_weight, and their rules against the
/// model family, data.source and train.update. Needs read_data, read_model and
/// read_train_update.
void read_train_losses(Reader& r, TrainConfig& c);
/// train.skip_memory_check, skip_disk_check, memory_probe, on_nonfinite,
/// max_nonfinite_steps, preempt_grace_s, time_limit_s.
void read_train_guards(Reader& r, TrainConfig& c);
/// train.r1_gamma, r1_every, pl_weight, pl_every, pl_batch_shrink, pl_decay, and their
/// rules against the model family (path length needs its styles; separate regularization
/// phases need the shared placement and the alternating update). Needs read_model,
/// read_train_loop and read_train_update.
void read_train_regularization(Reader& r, TrainConfig& c);
void read_train_plots(Reader& r, TrainConfig& c);      ///< train.plots
void read_train_grad_clip(Reader& r, TrainConfig& c);  ///< train.grad_clip

// config_placement.cpp
/// placement.generator_ranks (at most 1048576 ranks) and placement.defer_figures; both warn
/// when set under train.placement shared. Needs train.placement.
void read_placement(Reader& r, TrainConfig& c);
/// train.placement split: the rules against hpZ's and HSDP's auto sizes and dist.backend.
/// Needs every section.
void check_split(Reader& r, const TrainConfig& c);

// config_eval.cpp
/// eval.enabled, train.eval_every, train.eval_samples, eval.classifier, eval.reference,
/// eval.truncation. Needs read_model.
void read_eval(Reader& r, TrainConfig& c);

// config_sharding.cpp
/// sharding.<model>.* of both models (stage, resharding, activation checkpointing,
/// node_shared_gather, mixed precision, qwZ/qgZ and quantization_block), then each model's
/// replicate_degree (HSDP), then each model's hpz_partition_size; node_shared_gather is
/// refused with qwZ or hpZ.
void read_sharding(Reader& r, TrainConfig& c);
/// qgZ against dist.backend. Needs read_dist.
void check_sharding_quantized_backend(Reader& r, const TrainConfig& c);
/// HSDP's and hpZ's groups against dist.backend. Needs read_dist.
void check_sharding_groups_backend(Reader& r, const TrainConfig& c);

// config_optim.cpp
/// optim.<model>.* of both models (total_steps defaults to train.steps). Needs read_train_loop.
void read_optim(Reader& r, TrainConfig& c);
void read_ema(Reader& r, TrainConfig& c);         ///< ema.*; needs read_offload
void read_loss_scale(Reader& r, TrainConfig& c);  ///< loss_scale.*

// config_offload.cpp
/// offload.path and the ring's keys, then offload.<model>.{optimizer,param,gradient}.
/// Needs read_sharding and read_optim.
void read_offload(Reader& r, TrainConfig& c);

// config_augment.cpp
/// augment.mode, pipe, p, target, speed_kimg, interval (ADA), and their rules against the
/// placement, the update rule, the joint D pass and the model's images. Needs read_model,
/// read_train_update.
void read_augment(Reader& r, TrainConfig& c);

// config_dist.cpp
/// dist.backend (default from run.device), timeout_s, blocking_wait, progress_thread,
/// progress_interval_us. Needs read_run.
void read_dist(Reader& r, TrainConfig& c);

// config_checkpoint.cpp
/// checkpoint.async, then checkpoint.snapshot (warns when set without async). Needs read_dist
/// and read_offload.
void read_checkpoint(Reader& r, TrainConfig& c);

}  // namespace shardgan::config_sections
