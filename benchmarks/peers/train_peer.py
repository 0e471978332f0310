"""One PyTorch peer run of the benchmark: the PyTorch copy of a shardgan model,
started from a shardgan step-0 checkpoint, trained for a few steps with FSDP2 or DDP over
gloo on the CPU, exactly as shardgan's GanObjective::step does (src/train/objective.cpp).

    torchrun --standalone --nproc_per_node N benchmarks/peers/train_peer.py \
        --ckpt RUN/checkpoints/step-00000000 --data runs/peers/fmnist.h5 \
        --system fsdp2 --stage 3 --steps 10 --model dcgan --out results.jsonl

Rank 0 appends one JSON line to --out: system, model, params, world_size, stage, step_s
(median of steps 3-10), vmhwm_gib (largest over ranks, /proc/self/status VmHWM read after
the last step), and the per-step losses and times.

What is matched to shardgan (the checkpoint's resolved config gives the values):
  - weights and buffers (spectral-norm u, BatchNorm statistics): the step-0 checkpoint;
  - the latents: torch.Generator with the checkpoint's /rng/noise state, drawn as
    Trainer::draw_latents (z [B, ...], then y for BigGAN), the whole global batch on every
    rank, each rank keeping its slice;
  - the real data: the same converted HDF5 file (shardgan-data convert), the same
    DistributedSampler (randperm with seed + 1000003 * epoch, batch-major slices);
  - the step: d_steps D updates (G forward without grad, D on real then on fake as two
    forwards and two backwards, the fake one under the power-iteration pause), then one G
    update with D frozen (requires_grad off); loss nonsaturating or hinge; Adam with the
    config's lr, betas and eps; gradients averaged over ranks; BatchNorm over the global
    batch;
  - float32 everywhere; threads per rank = max(1, cores / ranks on the node), 1 inter-op
    thread (apps/train_main.cpp).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402
import models  # noqa: E402
import tolerance  # noqa: E402


def vmhwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a shardgan step-0 checkpoint directory (holds index.h5)")
    p.add_argument("--data", required=True, help="Fashion-MNIST as HDF5 (build/shardgan-data convert)")
    p.add_argument("--system", choices=["fsdp2", "ddp"], required=True)
    p.add_argument("--stage", type=int, default=None,
                   help="fsdp2: 3 = reshard_after_forward True, 2 = False; ddp: 0 (the default)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", default=None, help="name in the results (default: model.arch)")
    p.add_argument("--out", default=None, help="append the result line to this JSONL file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (negative controls, e.g. optim.discriminator.lr=4e-4)")
    p.add_argument("--skip-load", default=None, metavar="NAME|first",
                   help="negative control: leave one generator tensor (its name, or 'first': G's first "
                        "weight) at the copy's own N(0, 0.02) init instead of the checkpoint's value")
    p.add_argument("--note", default="")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: each rank on cuda:<LOCAL_RANK>, NCCL instead of gloo, torch's fused Adam")
    p.add_argument("--tf32", type=int, choices=[0, 1], default=1,
                   help="cuda: torch.backends.cudnn.allow_tf32 (shardgan's run.tf32)")
    return p.parse_args()


def main():
    a = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // local_world)
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    cuda = a.device == "cuda"
    if cuda:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        torch.backends.cudnn.allow_tf32 = bool(a.tf32)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == world

    cfg = ckpt.read_config(a.ckpt)
    for kv in a.set:
        k, _, v = kv.partition("=")
        cfg[k] = __import__("yaml").safe_load(v)
    if cfg["_step"] != 0:
        raise SystemExit(f"{a.ckpt} is step {cfg['_step']}, not a step-0 checkpoint")
    if cfg.get("model.dtype") != "float32":
        raise SystemExit("only model.dtype float32 is matched")
    B = int(cfg["train.global_batch"])
    if int(cfg["train.micro_batches"]) != 1:
        raise SystemExit("only train.micro_batches 1 is matched")
    if B % world:
        raise SystemExit(f"global batch {B} does not divide by {world} ranks")
    local = B // world
    d_steps = int(cfg.get("train.d_steps", 1))
    loss = cfg.get("train.loss", "nonsaturating")
    seed = int(cfg["run.seed"])
    arch = cfg.get("model.arch", "dcgan")
    stage = a.stage if a.stage is not None else (0 if a.system == "ddp" else 3)

    # ---- models from the step-0 checkpoint
    nparams = ckpt.count_params(a.ckpt)
    if a.system == "fsdp2":
        # FSDP2's recommended initialization: build on the meta device, shard, materialize
        # only this rank's shards (to_empty), then fill them from the checkpoint. No rank
        # ever holds the whole model, as in shardgan's deferred, sharded initialization.
        from torch.distributed.fsdp import fully_shard
        if stage not in (2, 3):
            raise SystemExit("fsdp2: --stage 2 (reshard_after_forward False) or 3 (True)")
        raf = stage == 3
        with torch.device("meta"):
            G, D = models.build(cfg)
        for m in (G, D):
            for u in m.units():  # one FSDP unit per shardgan unit (block)
                fully_shard(u, reshard_after_forward=raf)
            fully_shard(m, reshard_after_forward=raf)
            m.to_empty(device=dev)
    else:
        G, D = models.build(cfg)
    skip = None
    if a.skip_load:
        # the tensor that is not loaded gets a defined value (to_empty or torch.empty would
        # leave garbage): N(0, 0.02), drawn for its full shape and sliced like the loader
        pg = G.named_parameters()
        skip = next(n for n, p_ in pg if p_.dim() > 1) if a.skip_load == "first" else a.skip_load
        t = dict(G.named_parameters())[skip]
        full = torch.empty(t.shape).normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ckpt._copy(t, full.numpy())
    if a.system != "fsdp2":
        G.to(dev)
        D.to(dev)
    ckpt.load_into(G, a.ckpt, "generator", skip=skip)
    ckpt.load_into(D, a.ckpt, "discriminator")
    G.train()
    D.train()

    if a.system == "fsdp2":
        Gw, Dw, D_frozen = G, D, D
        d_real_ctx = contextlib.nullcontext
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        if stage != 0:
            raise SystemExit("ddp is stage 0")
        # Buffers (u, BatchNorm statistics) are identical on every rank by construction
        # (global-batch BatchNorm; u follows the all-reduced weights), as in shardgan, so
        # DDP need not broadcast them before each forward.
        ids = [dev.index] if cuda else None
        Gw = DDP(G, broadcast_buffers=False, device_ids=ids)
        Dw = DDP(D, broadcast_buffers=False, device_ids=ids)
        D_frozen = D  # the G step's D: no DDP (no D gradients to reduce)
        d_real_ctx = Dw.no_sync  # shardgan reduces D once per D step, after the fake pass

    def optim(name, params):
        t = cfg[f"optim.{name}.type"]
        if t != "adam" or cfg.get(f"optim.{name}.schedule", "constant") != "constant":
            raise SystemExit(f"optim.{name}: only constant-lr adam is matched")
        if float(cfg.get(f"optim.{name}.weight_decay", 0)) != 0:
            raise SystemExit(f"optim.{name}.weight_decay must be 0")
        return torch.optim.Adam(params, lr=float(cfg[f"optim.{name}.lr"]),
                                betas=(float(cfg[f"optim.{name}.beta1"]), float(cfg[f"optim.{name}.beta2"])),
                                eps=float(cfg[f"optim.{name}.eps"]), fused=True if cuda and a.system == "ddp" else None)

    opt_g = optim("generator", G.parameters())
    opt_d = optim("discriminator", D.parameters())

    # ---- data: shardgan's DistributedSampler over the converted file
    h5 = h5py.File(a.data, "r")
    imgs, labels = h5["imgs"], h5["labels"]
    paired = arch == "pix2pix"  # a file of pairs (shardgan-data convert --paired): y is A
    cond = h5["A"] if paired else None
    n_data = imgs.shape[0]
    batches_per_epoch = n_data // B
    perm_cache = {}
    counters = {"epoch": 0, "batch": 0}

    def real_batch():
        e, b = counters["epoch"], counters["batch"]
        counters["batch"] += 1
        if counters["batch"] == batches_per_epoch:
            counters["batch"], counters["epoch"] = 0, e + 1
        if e not in perm_cache:
            perm_cache.clear()
            perm_cache[e] = torch.randperm(n_data, generator=torch.Generator().manual_seed(seed + 1000003 * e))
        idx = perm_cache[e][b * B + rank * local: b * B + (rank + 1) * local].numpy()
        order = np.argsort(idx)
        inv = np.argsort(order)
        x = imgs[idx[order]][inv]  # h5py reads increasing indices
        x = torch.from_numpy(x).to(torch.float32).div_(127.5).sub_(1.0)
        y = torch.from_numpy(labels[idx[order]][inv].astype(np.int64)) if arch == "biggan" else None
        if paired:
            y = torch.from_numpy(cond[idx[order]][inv]).to(torch.float32).div_(127.5).sub_(1.0)
        return x.to(dev), None if y is None else y.to(dev)

    # ---- latents: the trainer's noise generator
    gen = torch.Generator()
    gen.set_state(ckpt.noise_state(a.ckpt))
    z_dim = int(cfg.get("model.z_dim", 0))

    def latents():
        if paired:  # one dropout seed per sample (Pix2PixFamily::sample_latents)
            return torch.randint(1 << 62, (B,), generator=gen, dtype=torch.int64), None
        if arch == "dcgan":
            return torch.randn((B, z_dim, 1, 1), generator=gen, dtype=torch.float32), None
        z = torch.randn((B, z_dim), generator=gen, dtype=torch.float32)
        y = torch.randint(int(cfg["model.n_classes"]), (B,), generator=gen, dtype=torch.int64)
        return z, y

    def mine(t):
        return None if t is None else t.narrow(0, rank * local, local).contiguous().to(dev)

    l1_weight = float(cfg.get("train.l1_weight", 0.0))
    adv_weight = float(cfg.get("train.adversarial_weight", 1.0))
    if loss == "least_squares":
        d_loss_real = lambda o: (o - 1.0).pow(2).mean()
        d_loss_fake = lambda o: o.pow(2).mean()
        g_loss = lambda o: (o - 1.0).pow(2).mean()
    elif loss == "hinge":
        d_loss_real = lambda o: torch.relu(1.0 - o).mean()
        d_loss_fake = lambda o: torch.relu(1.0 + o).mean()
        g_loss = lambda o: -o.mean()
    else:
        d_loss_real = lambda o: F.softplus(-o).mean()
        d_loss_fake = lambda o: F.softplus(o).mean()
        g_loss = lambda o: F.softplus(-o).mean()

    def step():
        stats = torch.zeros(2, dtype=torch.float64, device=dev)
        for _ in range(d_steps):
            z, y = latents()
            xr, yr = real_batch()
            y_fake = yr if paired else mine(y)  # paired: G translates this batch's A
            with torch.no_grad():
                fake = Gw(mine(z), y_fake)
            with d_real_ctx():
                d_real = Dw(xr, yr).reshape(-1)
                loss_real = d_loss_real(d_real)
                loss_real.backward()
            with models.power_iteration_pause():
                d_fake = Dw(fake, y_fake).reshape(-1)
            loss_fake = d_loss_fake(d_fake)
            loss_fake.backward()
            stats[0] += (loss_real.detach() + loss_fake.detach()).double() / d_steps
            opt_d.step()
            opt_d.zero_grad(set_to_none=True)
        for p in D.parameters():
            p.requires_grad_(False)
        if paired:  # G trains on the pairs and dropout seeds of the last D step
            zg, yg = mine(z), yr
        else:
            z, y = latents()
            zg, yg = mine(z), mine(y)
        fake = Gw(zg, yg)
        out = D_frozen(fake, yg).reshape(-1)
        lg = g_loss(out)
        total = lg * adv_weight + l1_weight * (fake - xr).abs().mean() if paired else lg
        total.backward()
        for p in D.parameters():
            p.requires_grad_(True)
        stats[1] += lg.detach().double()
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        return (stats / world).tolist()  # a host copy: on a GPU, the step's end

    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        ld, lg = step()
        times.append(time.perf_counter() - t0)
        losses.append([ld, lg])
    hwm = torch.tensor([float(vmhwm_bytes())], dtype=torch.float64, device=dev)
    all_hwm = [torch.zeros(1, dtype=torch.float64, device=dev) for _ in range(world)]
    dist.all_gather(all_hwm, hwm)
    if rank == 0:
        r1, s_red = tolerance.loss_rtol_step1(cfg)
        timed = times[2:10]
        gib = [float(t.item()) / 2**30 for t in all_hwm]
        rec = {
            "system": a.system, "model": a.model or arch, "params": nparams["generator"] + nparams["discriminator"],
            "params_g": nparams["generator"], "params_d": nparams["discriminator"],
            "world_size": world, "stage": stage,
            "step_s": statistics.median(timed) if timed else None,
            "vmhwm_gib": max(gib), "vmhwm_gib_per_rank": gib,
            "losses": losses, "step_times_s": times, "steps": a.steps,
            "global_batch": B, "d_steps": d_steps, "loss": loss, "threads_per_rank": threads,
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "torch": torch.__version__, "backend": "nccl" if cuda else "gloo", "device": a.device, "tf32": bool(a.tf32) if cuda else None,
            "cuda_max_reserved_mib": torch.cuda.max_memory_reserved(dev) // 2**20 if cuda else None,
            "cuda_max_allocated_mib": torch.cuda.max_memory_allocated(dev) // 2**20 if cuda else None,
            "fsdp": ("fully_shard per unit, reshard_after_forward=%s" % (stage == 3)) if a.system == "fsdp2" else None,
            "loss_rtol_step1": r1, "reduction_sqrt_sum": s_red,
            "overrides": a.set, "not_loaded": skip, "note": a.note,
        }
        line = json.dumps(rec)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")
    dist.barrier()
    h5.close()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's threads sometimes abort at interpreter exit ("terminate called without an
    # active exception"): the results are written, so leave without running destructors.
    os._exit(0)


if __name__ == "__main__":
    main()
