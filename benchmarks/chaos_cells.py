"""The chaos campaign's configuration cells and faults (benchmarks/chaos.py).

Every cell is a valid configuration of shardgan-train, listed explicitly, with whether a run
resumed after a fault is expected to equal the uninterrupted run bit for bit. The campaign
dry-runs every cell before it draws: a cell the config refuses is a defect of this list (it
is reported and never drawn).
"""

# Every trial: 8 steps, a checkpoint every 2 (all kept), the collective timeout at 30 s.
STEPS = 8
TIMEOUT_S = 30
COMMON = [
    "data.source=synthetic", "data.synthetic_size=96", "train.global_batch=24",
    f"train.steps={STEPS}", "train.checkpoint_every=2", "train.keep_checkpoints=10",
    "train.log_every=1", "train.sample_every=0", "train.plots=false", "train.threads=1",
    "run.seed=7", f"dist.timeout_s={TIMEOUT_S}", "ema.enabled=true", "ema.start_step=0",
]

DCGAN = ("configs/fmnist-dcgan.yaml", ["model.z_dim=16", "model.g_width=8", "model.d_width=8"])
BIGGAN = ("configs/fmnist-biggan.yaml", ["model.ch=8", "model.d_ch=8", "model.z_dim=8",
                                         "model.shared_dim=8", "eval.enabled=false"])
PIX2PIX = ("configs/fmnist-pix2pix.yaml", ["model.g_width=8", "model.d_width=8", "eval.enabled=false"])


def stage(g, d=None):
    return [f"sharding.generator.stage={g}", f"sharding.discriminator.stage={g if d is None else d}"]


def both(key, value):
    return [f"sharding.generator.{key}={value}", f"sharding.discriminator.{key}={value}"]


SIM = ["train.update=simultaneous", "train.shared_d_forward=true"]
SPLIT = ["train.placement=split", "placement.generator_ranks=1"]
# The EMA reads the generator's master shards, which parameter offload keeps on disk.
OFFLOAD_PARAM = ["offload.generator.param=disk", "offload.discriminator.param=disk",
                 "offload.generator.optimizer=disk", "offload.discriminator.optimizer=disk", "ema.enabled=false"]
OFFLOAD_GRAD = ["offload.generator.gradient=disk", "offload.discriminator.gradient=disk",
                "offload.generator.optimizer=disk", "offload.discriminator.optimizer=disk"]
OFFLOAD_SMALL = ["offload.buffer_bytes=1048576", "offload.buffer_count=3"]


def cell(name, model, np, args, deterministic=True, tags=()):
    config, model_args = model
    return {"name": name, "config": config, "np": np, "args": model_args + args,
            "deterministic": deterministic, "tags": set(tags)}


# tags: offload (the DirectFile injector's faults apply), async (a hung background writer),
# multihost (2 namespaced hosts x 2 ranks: a link cut).
CELLS = [
    cell("dcgan-s0", DCGAN, 2, stage(0)),
    cell("dcgan-s1", DCGAN, 2, stage(1)),
    cell("dcgan-s2-np3", DCGAN, 3, stage(2)),
    cell("dcgan-s3", DCGAN, 2, stage(3)),
    cell("dcgan-s3-np4", DCGAN, 4, stage(3)),
    cell("dcgan-g3-d1", DCGAN, 2, stage(3, 1)),
    cell("dcgan-s3-micro2", DCGAN, 2, stage(3) + ["train.micro_batches=2", "train.d_steps=2"]),
    cell("dcgan-s3-sim", DCGAN, 2, stage(3) + SIM),
    cell("dcgan-s3-grace", DCGAN, 2, stage(3) + ["train.preempt_grace_s=5"]),
    cell("dcgan-hsdp", DCGAN, 4, stage(3) + both("replicate_degree", 2)),
    cell("dcgan-hpz-qwz", DCGAN, 4, stage(3) + both("hpz_partition_size", 2) + both("quantized_weights", "int8")),
    cell("dcgan-qgz", DCGAN, 2, stage(2) + both("quantized_gradients", "int8")),
    cell("dcgan-async-fork", DCGAN, 2, stage(3) + ["checkpoint.async=true", "checkpoint.snapshot=fork"], tags=["async"]),
    cell("dcgan-async-copy", DCGAN, 2, stage(3) + ["checkpoint.async=true", "checkpoint.snapshot=copy"], tags=["async"]),
    cell("dcgan-offload-param", DCGAN, 2, stage(3) + OFFLOAD_PARAM + OFFLOAD_SMALL, tags=["offload"]),
    cell("dcgan-offload-grad", DCGAN, 2, stage(2) + OFFLOAD_GRAD + OFFLOAD_SMALL, tags=["offload"]),
    cell("biggan-s3", BIGGAN, 2, stage(3)),
    cell("biggan-s2-sim-np3", BIGGAN, 3, stage(2) + SIM),
    cell("biggan-split", BIGGAN, 3, stage(3) + SIM + SPLIT),
    cell("biggan-split-async", BIGGAN, 3, stage(3) + SIM + SPLIT + ["checkpoint.async=true"], tags=["async"]),
    cell("biggan-hpz-qgz", BIGGAN, 4, stage(3) + both("hpz_partition_size", 2) + both("quantized_weights", "int8")
         + both("quantized_gradients", "int8")),
    cell("biggan-offload", BIGGAN, 2, stage(3) + OFFLOAD_PARAM + ["offload.generator.gradient=disk",
                                                                  "offload.discriminator.gradient=disk"]
         + OFFLOAD_SMALL, tags=["offload"]),
    # A background save snapshots state held in memory: refused with any disk offload (the
    # gradient tier needs the optimizer's), so the async cells offload nothing.
    cell("biggan-async-copy", BIGGAN, 2, stage(3) + ["checkpoint.async=true", "checkpoint.snapshot=copy"],
         tags=["async"]),
    cell("pix2pix-s0", PIX2PIX, 2, stage(0)),
    cell("pix2pix-s3", PIX2PIX, 2, stage(3)),
    cell("dcgan-2hosts-hsdp", DCGAN, 4, stage(3) + both("replicate_degree", "auto"), tags=["multihost"]),
]

# Faults. `needs`: a cell tag the fault requires; `root`: needs root (mount, ip netns).
FAULTS = {
    "kill9": {},                 # SIGKILL to one random rank at a random time
    "sigterm_one": {},           # SIGTERM to one random rank
    "sigterm_all": {},           # SIGTERM to every rank at once
    "sigusr1_one": {},
    "sigusr1_all": {},
    "fsync_eio": {},             # the k-th fsync of one rank fails with EIO (SHARDGAN_TEST_FSYNC_FAULTS)
    "disk_full": {"root": True},  # run.dir on a small tmpfs, filled at a random time
    "io_eio": {"needs": "offload"},     # DirectFile injector on one rank, at a random completion
    "io_enospc": {"needs": "offload"},
    "io_short": {"needs": "offload"},   # retryable: the run must complete and equal the clean one
    "hung_writer": {"needs": "async"},  # one rank's background checkpoint writer never returns
    "link_cut": {"needs": "multihost", "root": True},
}


def faults_for(c, is_root):
    """The faults that apply to cell c, in FAULTS' order."""
    out = []
    for name, f in FAULTS.items():
        if f.get("root") and not is_root:
            continue
        if "needs" in f and f["needs"] not in c["tags"]:
            continue
        if "multihost" in c["tags"] and name == "disk_full":
            continue  # the hosts' ranks would need the tmpfs inside their namespaces: not drawn
        out.append(name)
    return out
