#pragma once
/// The training configuration: a YAML file (yaml-cpp) plus `--set key=value` overrides.
/// Keys are dotted paths ("train.steps"); configs/fmnist-dcgan.yaml lists them all.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardgan/optim/factory.h"
#include "shardgan/optim/loss_scaler.h"
#include "shardgan/optim/sharded_ema.h"
#include "shardgan/sharding/sharded_unit.h"
#include "shardgan/util/config_reader.h"

namespace shardgan {

class ModelFamily;

struct TrainConfig {
  std::string source;        ///< the YAML file it came from (for messages)
  std::string resolved_yaml; ///< every key with its final value, stored in checkpoints

  std::string run_dir = "runs/fmnist-dcgan";  ///< run.dir: samples, metrics, checkpoints
  /// run.device: cpu | cuda. With cuda each rank computes on cuda:<local rank> (from the
  /// launcher: OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID), and dist.backend defaults to
  /// nccl (mpi on cpu). See include/shardgan/device/device.h.
  std::string device = "cpu";
  /// run.tf32 (run.device cuda only): let cuDNN convolutions compute float32 in TensorFloat-32
  /// on Ampere and later GPUs, as LibTorch and PyTorch do by default
  /// (torch.backends.cudnn.allow_tf32). false keeps them in full float32, for parity with the
  /// CPU. Matrix products stay float32 either way (PyTorch's default). Ran on an H200
  /// (docs/gpu.md).
  bool tf32 = true;
  /// run.deterministic: torch.use_deterministic_algorithms(True) and
  /// torch.backends.cudnn.deterministic = True for the whole process (cuDNN and cuBLAS pick
  /// algorithms without atomics; CUBLAS_WORKSPACE_CONFIG is set to :4096:8 unless already set,
  /// as cuBLAS requires). A kernel with no deterministic version then throws, naming itself.
  /// For bit-for-bit comparisons on a GPU (with and without activation checkpointing); the CPU
  /// kernels shardgan uses are deterministic either way. Off by default: slower on a GPU.
  bool deterministic = false;
  /// The device run.device resolved to on this rank (resolve_device in device.h): set by
  /// shardgan-train before the Trainer is built; not a YAML key. CPU by default.
  c10::Device compute_device = c10::Device(c10::kCPU);
  uint64_t seed = 1234;                       ///< run.seed

  /// data.source: fashion-mnist (the idx files, all in RAM) | synthetic | hdf5 (BigGAN-PyTorch's
  /// layout: `imgs` uint8 [N, C, H, W] and `labels` int64 [N], read per rank in chunks)
  std::string data_source = "fashion-mnist";
  /// data.path: the Fashion-MNIST folder, or the .h5 file for data.source hdf5
  std::string data_path = "/usr/share/datasets/fashion-mnist";
  int64_t synthetic_size = 240;               ///< data.synthetic_size (images)
  int64_t prefetch_batches = 4;               ///< data.prefetch_batches: hdf5 read-ahead queue (micro-batches)

  int64_t steps = 600;            ///< train.steps: total optimizer steps (each D then G)
  int64_t global_batch = 64;      ///< train.global_batch, split evenly over ranks
  int64_t micro_batches = 1;      ///< train.micro_batches: gradient accumulation steps
  int64_t log_every = 10;         ///< train.log_every (steps)
  int64_t sample_every = 100;     ///< train.sample_every (steps; 0 = only at the end)
  int64_t checkpoint_every = 200; ///< train.checkpoint_every (steps; 0 = only at the end)
  int64_t threads = 0;            ///< train.threads per rank (0 = cores / local ranks)
  int64_t keep_checkpoints = 3;   ///< train.keep_checkpoints: newest committed ones kept

  int64_t d_steps = 1;            ///< train.d_steps: D steps per G step (BigGAN uses 2)
  /// train.d_joint_pass: D sees the fake and the real images of a micro-batch in one
  /// forward and one backward (BigGAN-PyTorch's G_D: D(cat([G(z), x]))), so each D unit is
  /// gathered twice and reduce-scattered once per micro-batch instead of four times and
  /// twice. Batch-coupled layers in D (BatchNorm) then see the joint batch. A micro-batch
  /// whose D update takes R1 keeps separate passes.
  bool d_joint_pass = false;
  std::string loss = "nonsaturating";  ///< train.loss: nonsaturating | hinge
  bool skip_memory_check = false; ///< train.skip_memory_check: skip the memory pre-flight
  /// train.memory_probe: the pre-flight measures one step's transient memory on a stand-in
  /// world (train/activation_probe.h) instead of padding the estimate (CPU, no HSDP)
  bool memory_probe = true;
  /// train.on_nonfinite: skip | abort. What a NaN or Inf in a model's loss or gradients does
  /// (all ranks vote): skip that model's update (parameters, optimizer state and EMA
  /// untouched; counted in metrics.jsonl), or end the job naming the step and the model.
  std::string on_nonfinite = "skip";
  double r1_gamma = 0.0;           ///< train.r1_gamma: R1 penalty weight on real images (0 = off)
  int64_t r1_every = 1;           ///< train.r1_every: lazy R1, every k-th D update (StyleGAN2: 16)
  int64_t eval_every = 0;         ///< train.eval_every: FID / class accuracy every k steps (0 = only at the end if on)
  int64_t eval_samples = 2000;    ///< train.eval_samples: generated images per evaluation (split over ranks)
  bool eval_enabled = false;      ///< eval.enabled: compute FID (needs eval.classifier)
  std::string eval_classifier = "runs/fmnist-classifier.h5";  ///< eval.classifier: `shardgan-fid train-classifier` output
  /// eval.reference: Fashion-MNIST folder whose t10k split gives the real feature statistics
  std::string eval_reference = "/usr/share/datasets/fashion-mnist";
  bool plots = true;              ///< train.plots: write plots/*.png with gnuplot (warns once if missing)
  int64_t max_nonfinite_steps = 10; ///< train.max_nonfinite_steps: skipped steps in a row
                                    ///<   before the job ends anyway (>= 1)
  /// train.preempt_grace_s: seconds between a preemption signal and the kill (Slurm's
  /// --signal=USR1@<s>); 0 = finish the step, then save. Above 0 the ranks also vote at
  /// every unit forward until the step's first optimizer update, and abandon the step
  /// (saving the last completed one) when the rest of the step plus a save would not fit.
  double preempt_grace_s = 0;

  at::ScalarType model_dtype = at::kFloat;  ///< model.dtype: float32 | float64 (masters)
  /// model.arch (dcgan | biggan) and that family's model.* keys.
  std::shared_ptr<const ModelFamily> family;
  ShardingConfig g_sharding;      ///< sharding.generator.{stage,reshard_after_forward,
                                  ///<   activation_checkpointing,checkpoint_segments,
                                  ///<   compute_dtype,reduce_dtype}
  ShardingConfig d_sharding;      ///< sharding.discriminator.{...}
  /// sharding.<model>.replicate_degree: hybrid sharding (HSDP, ZeRO++ hpZ). R >= 1 replica
  /// groups of world size / R ranks; the model is sharded inside a group and replicated
  /// across groups (hybrid_communicator.h). 1 = plain sharding over every rank; 0 (`auto`)
  /// = one group per node, from the launcher's local ranks. Stages 1-3 only.
  int g_replicate_degree = 1;
  int d_replicate_degree = 1;
  OptimizerConfig g_optim;        ///< optim.generator.{type,lr,beta1,beta2,eps,weight_decay,
                                  ///<   momentum,dampening,nesterov,alpha,centered,schedule,
                                  ///<   warmup_steps,total_steps,min_lr,step_size,gamma}
  OptimizerConfig d_optim;        ///< optim.discriminator.{...}
  double grad_clip = 0.0;         ///< train.grad_clip: global grad-norm bound per model (0 = off)
  bool ema_enabled = false;       ///< ema.enabled: keep a sharded EMA of G, sample from it too
  EmaConfig ema;                  ///< ema.{decay,start_step}
  LossScalerConfig loss_scale;    ///< loss_scale.{init_scale,growth_interval,hysteresis}
                                  ///<   (active only for float16 compute)

  std::string backend = "mpi";    ///< dist.backend: mpi | nccl (default: nccl on cuda, mpi on cpu)
  double timeout_s = 600.0;       ///< dist.timeout_s: per collective (seconds)
  /// dist.blocking_wait (nccl only; c10d's TORCH_NCCL_BLOCKING_WAIT): an async collective's
  /// wait blocks the host until it finished, instead of making the compute stream wait for
  /// it while a watchdog thread enforces the timeout (the default, false).
  bool blocking_wait = false;
  /// dist.progress_thread (mpi only): a helper thread enters MPI every
  /// dist.progress_interval_us while a prefetched all-gather or reduce-scatter is in flight,
  /// so it advances during compute (Open MPI has no asynchronous progress of its own).
  bool progress_thread = false;
  double progress_interval_us = 200.0;  ///< dist.progress_interval_us (microseconds, >= 1)
};

/// Reads `path` and applies `overrides` ("key=value", e.g. "train.steps=200"). Throws
/// ConfigError naming the file and key for a missing file, a YAML syntax error, an unknown
/// key, or a value of the wrong type or out of range.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides);

/// The same from YAML text; `source` names it in messages.
TrainConfig parse_config(const std::string& yaml_text, const std::string& source,
                         const std::vector<std::string>& overrides);

}  // namespace shardgan
