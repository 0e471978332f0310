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
import math
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
    p.add_argument("--dump-params", default=None, metavar="FILE.pt",
                   help="after the last step, rank 0 saves G's and D's full parameters and buffers "
                        "(torch.save; for comparing with shardgan's final checkpoint)")
    p.add_argument("--fsdp-defaults", action="store_true",
                   help="stylegan2 under fsdp2: FSDP2's default settings for the regularization updates too "
                        "(reshard_after_backward True), which crash on path length's double backward; "
                        "without it G reg runs under set_reshard_after_backward(False)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: each rank on cuda:<LOCAL_RANK>, NCCL instead of gloo, torch's fused Adam")
    p.add_argument("--tf32", type=int, choices=[0, 1], default=1,
                   help="cuda: torch.backends.cudnn.allow_tf32 (shardgan's run.tf32)")
    return p.parse_args()


def main():
    a = parse_args()
    # A segmentation fault (FSDP2's default settings on path length's double backward) prints
    # the Python stack, which run.sh puts in the failed cell's line.
    import faulthandler
    faulthandler.enable()
    import warnings
    # StyleGAN2's G returns ws, an expand() of w (as shardgan's), which FSDP2 warns about; no
    # in-place op touches it.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
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
    sg2 = arch == "stylegan2"
    # StyleGAN2's separate regularization updates (src/train/regularization.cpp): R1 as a D
    # update of its own every r1_every-th step, path length as a G update of its own every
    # pl_every-th step; the optimizers' lr x c and betas^c, c = I / (I + 1) for a model whose
    # regularizer is on (lazy_regularization_ratio, src/train/config_train.cpp).
    r1_gamma = float(cfg.get("train.r1_gamma", 0))
    r1_every = int(cfg.get("train.r1_every", 1))
    pl_weight = float(cfg.get("train.pl_weight", 0)) if sg2 else 0.0
    pl_every = int(cfg.get("train.pl_every", 4))
    pl_shrink = int(cfg.get("train.pl_batch_shrink", 2))
    pl_decay = float(cfg.get("train.pl_decay", 0.01))
    if r1_gamma > 0 and not sg2:
        raise SystemExit("train.r1_gamma > 0 is matched for stylegan2 only")
    lazy_c = {"generator": pl_every / (pl_every + 1.0) if pl_weight > 0 else 1.0,
              "discriminator": r1_every / (r1_every + 1.0) if r1_gamma > 0 else 1.0}
    if sg2 and (cfg.get("augment.mode", "none") != "none" or cfg.get("train.update", "alternating") != "alternating"
                or cfg.get("train.d_joint_pass") or loss != "nonsaturating" or d_steps != 1):
        raise SystemExit("stylegan2: only augment.mode none, the alternating update, separate real and fake D "
                         "passes, the nonsaturating loss and d_steps 1 are matched")

    # ---- models from the step-0 checkpoint
    nparams = ckpt.count_params(a.ckpt)
    fsdp_desc = None
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
        fsdp_desc = "fully_shard per unit, reshard_after_forward=%s" % raf
        if sg2:
            fsdp_desc += ("; default settings for the regularization updates (reshard_after_backward=True)"
                          if a.fsdp_defaults else
                          "; G reg (path length) under set_reshard_after_backward(False), resharded by hand "
                          "after its backward; D reg (R1) default")
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
        c = lazy_c[name]  # lazy_corrected (src/optim/factory.cpp): lr x c, betas^c (1 without a regularizer)
        return torch.optim.Adam(params, lr=float(cfg[f"optim.{name}.lr"]) * c,
                                betas=(float(cfg[f"optim.{name}.beta1"]) ** c, float(cfg[f"optim.{name}.beta2"]) ** c),
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
        conditional = arch == "biggan" or (sg2 and int(cfg.get("model.n_classes", 0)) > 0)
        y = torch.from_numpy(labels[idx[order]][inv].astype(np.int64)) if conditional else None
        if paired:
            y = torch.from_numpy(cond[idx[order]][inv]).to(torch.float32).div_(127.5).sub_(1.0)
        return x.to(dev), None if y is None else y.to(dev)

    # ---- latents: the trainer's noise generator
    gen = torch.Generator()
    gen.set_state(ckpt.noise_state(a.ckpt))
    z_dim = int(cfg.get("model.z_dim", 0))
    G_num_ws = G.num_ws if sg2 else 0

    def latents():
        if paired:  # one dropout seed per sample (Pix2PixFamily::sample_latents)
            return torch.randint(1 << 62, (B,), generator=gen, dtype=torch.int64), None
        if arch == "dcgan":
            return torch.randn((B, z_dim, 1, 1), generator=gen, dtype=torch.float32), None
        if sg2:  # StyleGan2Family::sample_latents (style mixing 0: no cutoff draws), then sample_labels
            zz = torch.randn((B, 2 * z_dim), generator=gen, dtype=torch.float32)
            seeds = torch.randint(0, 1 << 24, (B,), generator=gen, dtype=torch.int64)
            z = torch.cat([zz, torch.full((B, 1), float(G_num_ws)), seeds.to(torch.float32).unsqueeze(1),
                           torch.ones(B, 1)], 1)
            n_cls = int(cfg.get("model.n_classes", 0))
            y = torch.randint(n_cls, (B,), generator=gen, dtype=torch.int64) if n_cls > 0 else None
            return z, y
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

    # ---- StyleGAN2: SharedStepExecutor::step with separate regularization updates
    # (src/train/shared_step.cpp, objective.cpp, regularization.cpp): D's update, D reg (R1)
    # when the step index is a multiple of r1_every, G's update, G reg (path length) when it is
    # a multiple of pl_every; each an Adam step of its own on the same optimizer as the model's
    # main update.
    pl_state = {"mean": 0.0, "filled": 0}
    fsdp_modules = []
    if a.system == "fsdp2":
        from torch.distributed.fsdp import FSDPModule
        fsdp_modules = [m for m in G.modules() if isinstance(m, FSDPModule)]

    def update(opt):
        # shardgan's optimizer updates every element of a model; torch's Adam skips a parameter
        # whose .grad is None. The "* 0" terms of the regularizers give every parameter a
        # gradient; any that still has none gets zeros (counted in grads_filled_with_zeros).
        for group in opt.param_groups:
            for p_ in group["params"]:
                if p_.grad is None:
                    p_.grad = torch.zeros_like(p_)
                    pl_state["filled"] += 1
        opt.step()
        opt.zero_grad(set_to_none=True)

    def avg(v):
        t = v.detach().to(torch.float64).reshape(1).clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / world

    def sg2_step(t):
        stats = torch.zeros(2, dtype=torch.float64, device=dev)
        # D's update (d_update): latents {z, y}, the real batch, G's images under no_grad, D on
        # the real batch (backward), D on the fake batch (backward), Adam.
        z, y = latents()
        xr, yr = real_batch()
        with torch.no_grad():
            fake = Gw(mine(z), mine(y))[0]
        with d_real_ctx():
            d_real = Dw(xr, yr).reshape(-1)
            loss_real = d_loss_real(d_real)
            loss_real.backward()
        d_fake = Dw(fake, mine(y)).reshape(-1)
        loss_fake = d_loss_fake(d_fake)
        loss_fake.backward()
        stats[0] += (loss_real.detach() + loss_fake.detach()).double()
        update(opt_d)
        r1 = 0.0
        if r1_gamma > 0 and t % r1_every == 0:
            # D reg (d_reg, r1_forward): the penalty alone on the real batch of D's update,
            # (gamma / 2) mean_i |d sum(D(x)) / dx_i|^2, times r1_every, plus logits.mean() * 0
            x = xr.detach().requires_grad_(True)
            logits = Dw(x, yr).reshape(-1)
            gx, = torch.autograd.grad(logits.sum(), x, create_graph=True)
            penalty = gx.pow(2).flatten(1).sum(1).mean() * (0.5 * r1_gamma)
            (penalty * float(r1_every) + logits.mean() * 0.0).backward()
            r1 = float(avg(penalty).item())  # the global batch's mean, as shardgan's all-reduce
            update(opt_d)
        # G's update (g_pass): fresh latents, D frozen (input gradients only)
        for p_ in D.parameters():
            p_.requires_grad_(False)
        z, y = latents()
        fake = Gw(mine(z), mine(y))[0]
        lg = g_loss(D_frozen(fake, mine(y)).reshape(-1))
        lg.backward()
        for p_ in D.parameters():
            p_.requires_grad_(True)
        stats[1] += lg.detach().double()
        update(opt_g)
        pl = None
        if pl_weight > 0 and t % pl_every == 0:
            # G reg (g_reg): fresh latents, the first B / pl_batch_shrink rows (this rank's
            # equal share of them), images and styles ws; noise u ~ N(0, 1) / sqrt(H W) from the
            # latents' generator for the whole path-length batch, drawn after G's forward;
            # a = sqrt(mean over ws of |d sum(img u) / dw|^2); the running mean in float32,
            # moved by the mean of a over every rank's samples; penalty mean (a - m)^2, times
            # pl_weight * pl_every, plus img.sum() * 0.
            z, y = latents()
            n = B // pl_shrink
            ln = n // world
            zl = z[:n].narrow(0, rank * ln, ln).contiguous().to(dev)
            yl = None if y is None else y[:n].narrow(0, rank * ln, ln).contiguous().to(dev)
            keep = a.system == "fsdp2" and not a.fsdp_defaults
            if keep:  # FSDP2's default resharding crashes the second backward (docs/results.md#stylegan2-fsdp2)
                G.set_reshard_after_backward(False)
            img, ws = Gw(zl, yl)
            noise = torch.randn((n, img.shape[1], img.shape[2], img.shape[3]), generator=gen, dtype=torch.float32)
            u = noise.narrow(0, rank * ln, ln).to(dev, img.dtype) / math.sqrt(img.shape[2] * img.shape[3])
            gw, = torch.autograd.grad((img * u).sum(), ws, create_graph=True)
            lengths = gw.to(torch.float32).square().sum(2).mean(1).sqrt()
            mean = avg(lengths.detach().mean())
            m = torch.full((), pl_state["mean"], dtype=torch.float32)
            m = m + (mean.reshape(()).to(torch.float32) - m) * pl_decay
            pl_state["mean"] = m.item()
            penalty = (lengths - m.to(lengths.device)).square().mean()
            loss_pl = penalty * (pl_weight * float(pl_every)) + img.sum().to(torch.float32) * 0.0
            loss_pl.backward()
            if keep:
                # The gradients are reduce-scattered; the gathered weights must be freed by hand:
                # FSDP2 does not gather a module that is still unsharded, so without this the next
                # forward would run on the weights of before the optimizer step (measured: step 2's
                # loss_d 1.2492 instead of 1.2328).
                for fm in fsdp_modules:
                    fm.reshard()
                G.set_reshard_after_backward(True)
            pl = float(avg(penalty).item())  # shardgan's step figures: every rank's penalty, averaged
            update(opt_g)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        ld, lgv = (stats / world).tolist()
        return ld, lgv, [r1 if r1_gamma > 0 else None, pl, pl_state["mean"] if pl_weight > 0 else None]

    times, losses, regs = [], [], []
    failure = None
    for t in range(a.steps):
        t0 = time.perf_counter()
        if sg2:
            try:
                ld, lg, reg = sg2_step(t)
            except Exception as e:  # a result (e.g. FSDP2's default settings on the double backward)
                failure = f"step {t}: {type(e).__name__}: {str(e)[:400]}"
                break
            regs.append(reg)
        else:
            ld, lg = step()
        times.append(time.perf_counter() - t0)
        losses.append([ld, lg])
    if failure is not None:
        print(f"[rank {rank}] {failure}", file=sys.stderr, flush=True)
        if rank == 0:
            rec = {"system": a.system, "model": a.model or arch, "world_size": world, "stage": stage,
                   "failed": True, "error": failure, "fsdp": fsdp_desc, "losses": losses,
                   "overrides": a.set, "not_loaded": skip, "note": a.note, "torch": torch.__version__}
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
    if a.dump_params:
        from torch.distributed.tensor import DTensor
        full = {}
        for tag, m in (("generator", G), ("discriminator", D)):
            if fsdp_modules or a.system == "fsdp2":
                for fm in m.modules():
                    if hasattr(fm, "reshard") and hasattr(fm, "unshard"):
                        fm.reshard()
            for name, t in list(m.named_parameters()) + list(m.named_buffers()):
                v = t.full_tensor() if isinstance(t, DTensor) else t
                full[f"{tag}/{name}"] = v.detach().cpu().clone()
        if rank == 0:
            torch.save(full, a.dump_params)
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
            "fsdp": fsdp_desc,
            "loss_rtol_step1": r1, "reduction_sqrt_sum": s_red,
            "overrides": a.set, "not_loaded": skip, "note": a.note,
        }
        if sg2:
            # [r1, pl, pl_mean] per step, as shardgan's metrics.jsonl: r1 (0 on steps without D
            # reg), pl (the steps with G reg, else None), pl_mean after the step
            rec["reg_losses"] = regs
            rec["reg_rtol_step1"] = tolerance.reg_rtol_step1(cfg)
            rec["grads_filled_with_zeros"] = pl_state["filled"]
            rec["lazy_c"] = lazy_c
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
