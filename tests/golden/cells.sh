# The golden set (sourced by run.sh and golden_runs_test.sh): float64 runs of 4 steps with
# checkpoints at steps 2 and 4 that cover the step's combinations. Each line:
#   NAME NP REFERENCE ARGS...
# REFERENCE is the cell that the run equals within 1e-9 (a stage-0 run on one rank, or
# "bitwise:<cell>" where the feature is lossy and only its twin without hpZ can match).
# Needs SRC (the source tree) set.
golden_cells() {
  local dc="$SRC/configs/fmnist-dcgan.yaml --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8"
  local bg="$SRC/configs/fmnist-biggan.yaml --set model.ch=8 --set model.d_ch=8 --set model.z_dim=8 --set model.shared_dim=8 --set train.r1_gamma=0.1 --set eval.enabled=false"
  local p2p="$SRC/configs/fmnist-pix2pix.yaml --set model.g_width=8 --set model.d_width=8 --set eval.enabled=false"
  local s0="--set sharding.generator.stage=0 --set sharding.discriminator.stage=0"
  local s3="--set sharding.generator.stage=3 --set sharding.discriminator.stage=3"
  local sim="--set train.update=simultaneous --set train.shared_d_forward=true"
  local off="--set offload.generator.optimizer=disk --set offload.generator.gradient=disk --set offload.discriminator.optimizer=disk --set offload.discriminator.gradient=disk --set offload.discriminator.param=disk"
  local hpz="--set sharding.generator.hpz_partition_size=2 --set sharding.discriminator.hpz_partition_size=2"
  local qwz="--set sharding.generator.quantized_weights=int8 --set sharding.discriminator.quantized_weights=int8"
  cat <<CELLS
dcgan-ref 1 - $dc $s0
dcgan-s0 2 dcgan-ref $dc $s0
dcgan-s3 2 dcgan-ref $dc $s3
biggan-ref 1 - $bg $s0 $sim
biggan-sim 2 biggan-ref $bg $s3 $sim
biggan-split 3 biggan-ref $bg $s3 $sim --set train.placement=split --set placement.generator_ranks=1
dcgan-hsdp 4 dcgan-ref $dc $s3 --set sharding.generator.replicate_degree=2 --set sharding.discriminator.replicate_degree=2
dcgan-qwz 4 - $dc $s3 $qwz
dcgan-hpz-qwz 4 bitwise:dcgan-qwz $dc $s3 $hpz $qwz
pix2pix-ref 1 - $p2p $s0
pix2pix-s3 2 pix2pix-ref $p2p $s3
dcgan-offload 2 dcgan-ref $dc $s3 $off
dcgan-async 2 dcgan-ref $dc $s3 --set checkpoint.async=true
CELLS
}
GOLDEN_COMMON=(--set data.source=synthetic --set data.synthetic_size=48 --set train.global_batch=16
               --set train.micro_batches=2 --set train.d_steps=2 --set model.dtype=float64
               --set train.steps=4 --set train.checkpoint_every=2 --set train.log_every=1
               --set train.sample_every=0 --set train.plots=false --set train.threads=1
               --set train.skip_memory_check=true --set run.seed=7 --set ema.enabled=true
               --set ema.start_step=0)
