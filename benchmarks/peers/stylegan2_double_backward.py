"""Does PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) run StyleGAN2's second-order regularizers?

Measures, for a tiny StyleGAN2 (32x32, 3 channels, channel_max 16, z/w 32, unconditional,
float32), whether the two regularizers that differentiate through a gradient
(create_graph=True) run under each way of distributing the model, and whether the gradients
they leave on the parameters are the right ones:

  - R1 (D): g = d sum(D(x)) / dx with create_graph; penalty = |g|^2 per sample, mean;
    (penalty * gamma / 2 + logits.mean() * 0).backward().
  - path length (G): ws = mapping(z) broadcast to all layers, imgs = synthesis(ws);
    g = d sum(imgs * noise / sqrt(H W)) / dws with create_graph;
    lengths = sqrt(mean over layers of |g|^2); penalty = (lengths - mean(lengths).detach())^2,
    mean; (imgs[:, 0, 0, 0] * 0 + penalty).mean().backward() (the "* 0" term, as in the
    authors' training loop, only gives the last toRGB biases a (zero) gradient).

Modes (a fresh model, same seed on every rank, for every mode and regularizer):
  - fsdp2_default: fully_shard on every unit (each D block and D's epilogue conv/fc/out as one
    group; G's mapping and each G synthesis block), then on the root, default settings;
  - fsdp2_no_reshard_after_backward: the same, then root.set_reshard_after_backward(False)
    (recursive);
  - fsdp2_no_reshard: the same with reshard_after_forward=False on every unit and
    set_reshard_after_backward(False) (the unsharded parameters are never freed);
  - ddp: DistributedDataParallel (defaults);
  - local: no wrapping; its gradients, averaged over the ranks with all_reduce, are the
    reference every other mode is compared with (max_abs_diff_vs_local_allreduced; the FSDP
    gradients are gathered with DTensor.full_tensor(), after reshard()).

fully_shard refuses 0-dim parameters, and the peer G has one per synthesis layer
(noise_strength): one extra case, fsdp2_default_unpatched_G, records that error for the peer's
G as it is; every other path-length case (all modes, so that the reference matches) uses G with
those parameters reshaped to [1] (same value, same broadcast; the peer file is not changed).

Per case it records ok / the error (type and the first 300 characters), whether every
parameter got a finite gradient, the largest absolute difference from the reference, the
wall time and the worker process's peak RSS so far (ru_maxrss, a running maximum over the
cases that worker ran). Each rank draws
its own batch of 2 (seed 1000 + rank); synthesis noise is the layers' constant noise, so the
modes see identical computations.

A case can kill its process (fsdp2_default's path length segfaults in torch 2.15), so the
torch.distributed.run processes only coordinate (their own gloo group): each starts a worker
process (a fresh interpreter, its own gloo group on a new port) that runs the cases in order and
writes one result file per case; if a worker dies, the peer's is killed, the case is recorded
as "process died (signal ...)" and new workers resume at the next case. Rank 0 reads both
ranks' files (one machine) and compares the gradients.

Run on CPU, gloo, 2 processes (about 20 s):

    .venv/bin/python -m torch.distributed.run --nproc_per_node 2 \\
        benchmarks/peers/stylegan2_double_backward.py [--out FILE.json]

Rank 0 prints one JSON object and writes it to --out if given. The model is the project's own
plain-PyTorch StyleGAN2 in benchmarks/peers/stylegan2.py (written from the papers; no NVIDIA
code).
"""
import argparse
import datetime
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stylegan2 as sg2  # noqa: E402

RES, CH, Z_DIM, W_DIM, MAP_LAYERS = 32, 3, 32, 32, 2
CHANNEL_BASE, CHANNEL_MAX = 512, 16
BATCH, GAMMA = 2, 10.0
MODES = ["fsdp2_default", "fsdp2_no_reshard_after_backward", "fsdp2_no_reshard", "ddp", "local"]
REGULARIZERS = ["r1", "path_length"]


class GenWithWs(nn.Module):
    """G's forward that also returns the broadcast styles ws (the peer's Generator.forward
    returns only the image). Constant noise so that every mode computes the same thing."""

    def __init__(self, g):
        super().__init__()
        self.g = g

    def forward(self, z):
        w = self.g.mapping(z)
        ws = w.unsqueeze(1).expand(-1, self.g.num_ws, -1)
        return self.g.synthesis(ws, noise="const"), ws


def build(reg, patch_scalars=True):
    torch.manual_seed(0)
    if reg == "r1":
        return sg2.Discriminator(RES, img_channels=CH, channel_base=CHANNEL_BASE, channel_max=CHANNEL_MAX,
                                 mbstd_group=BATCH)
    g = sg2.Generator(RES, z_dim=Z_DIM, w_dim=W_DIM, img_channels=CH, mapping_layers=MAP_LAYERS,
                      channel_base=CHANNEL_BASE, channel_max=CHANNEL_MAX)
    if patch_scalars:
        # fully_shard rejects 0-dim parameters (SynthesisLayer.noise_strength): make them [1]
        # (same value, broadcasts the same), in every mode so that the reference matches.
        for m in g.modules():
            if isinstance(m, sg2.SynthesisLayer):
                m.noise_strength = nn.Parameter(m.noise_strength.detach().reshape(1).clone())
    return GenWithWs(g)


def wrap(model, mode, mesh):
    if mode == "local":
        return model
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard
    kw = dict(mesh=mesh)
    if mode == "fsdp2_no_reshard":
        kw["reshard_after_forward"] = False
    if isinstance(model, sg2.Discriminator):
        for b in model.blocks:
            fully_shard(b, **kw)
        fully_shard([model.conv, model.fc, model.out], **kw)  # the epilogue as one group
    else:
        fully_shard(model.g.mapping, **kw)
        for b in model.g.blocks:
            fully_shard(b, **kw)
    fully_shard(model, **kw)
    if mode in ("fsdp2_no_reshard_after_backward", "fsdp2_no_reshard"):
        model.set_reshard_after_backward(False)
    return model


def run_case(model, reg, rank):
    gen = torch.Generator().manual_seed(1000 + rank)
    if reg == "r1":
        x = torch.randn(BATCH, CH, RES, RES, generator=gen).requires_grad_()
        logits = model(x)
        g, = torch.autograd.grad(logits.sum(), x, create_graph=True)
        penalty = g.square().sum([1, 2, 3]).mean()
        (penalty * (GAMMA / 2) + logits.mean() * 0).backward()
    else:
        z = torch.randn(BATCH, Z_DIM, generator=gen)
        imgs, ws = model(z)
        noise = torch.randn(imgs.shape, generator=gen) / math.sqrt(imgs.shape[2] * imgs.shape[3])
        grads, = torch.autograd.grad((imgs * noise).sum(), ws, create_graph=True)
        lengths = grads.square().sum(2).mean(1).sqrt()
        penalty = (lengths - lengths.mean().detach()).square().mean()
        (imgs[:, 0, 0, 0] * 0 + penalty).mean().backward()


def collect_grads(model):
    """Full (unsharded) gradients by parameter name, None where missing. Collective for FSDP."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    # With reshard_after_backward=False the modules still hold the unsharded parameters, which
    # named_parameters() then returns (their .grad is None: the reduced gradient sits on the
    # sharded DTensor); reshard() registers the sharded ones again.
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    out = {}
    for name, p in model.named_parameters():
        name = name.removeprefix("module.")
        g = p.grad
        if isinstance(g, DTensor):
            g = g.full_tensor()
        out[name] = None if g is None else g.detach().clone()
    return out


# (label, mode for wrap(), regularizer, patch the 0-dim parameters); local first per regularizer:
# it is the reference of the others
CASES = [("fsdp2_default_unpatched_G", "fsdp2_default", "path_length", False)] + [
    (mode, mode, reg, True) for reg in REGULARIZERS for mode in ["local"] + [m for m in MODES if m != "local"]]


def error_text(e):
    return f"{type(e).__name__}: {str(e)[:300]}"


def worker(start, outdir):
    """One process of a 2-process group: runs CASES[start:] in order, one result file per case
    (written before the next one starts), so that a crash (segfault) ends only the case it hits."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for k in range(start, len(CASES)):
        label, mode, reg, patch = CASES[k]
        print(f"[rank {rank}] case {k}: {label} {reg}", file=sys.stderr, flush=True)
        rec = dict(ok=False, error=None)
        t0 = time.perf_counter()
        model = None
        try:
            model = wrap(build(reg, patch_scalars=patch), mode, mesh)
            run_case(model, reg, rank)
            rec["ok"] = True
        except Exception as e:  # a result, not a bug of the script
            rec["error"] = error_text(e)
            if os.environ.get("SG2_DB_TRACE"):
                traceback.print_exc()
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        grads = None
        # every rank must agree before the collectives that gather FSDP's gradients
        flag = torch.tensor([1 if rec["ok"] else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() == 1:
            try:
                grads = collect_grads(model)
            except Exception as e:
                rec["grad_check_error"] = error_text(e)
        rec["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        torch.save(dict(rec=rec, grads=grads), os.path.join(outdir, f"case{k}_rank{rank}.pt"))
        del model
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(start, outdir, rank, world, port, store, tag):
    """Runs worker(start) in a fresh interpreter; if this or the peer's worker dies, the other is
    killed (a peer blocked in a collective would otherwise wait for the gloo timeout)."""
    # torch.distributed.run's variables would make the worker look for the launcher's store
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONFAULTHANDLER="1")
    errpath = os.path.join(outdir, f"stderr{tag}_rank{rank}.txt")
    with open(errpath, "w") as err:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(start),
                                  "--dir", outdir], env=env, stdout=err, stderr=err)
        t0, killed = time.perf_counter(), None
        while child.poll() is None:
            if store.check([f"dead{tag}"]) or time.perf_counter() - t0 > 120:
                time.sleep(1.0)
                if child.poll() is None:
                    child.kill()
                    killed = "killed after the peer process died" if store.check([f"dead{tag}"]) \
                        else "killed after 120 s"
                break
            time.sleep(0.05)
        rc = child.wait()
    if rc != 0 and killed is None:
        store.set(f"dead{tag}", "1")
    with open(errpath) as f:
        lines = f.read().splitlines()
    sys.stderr.write("".join(line + "\n" for line in lines if line.startswith("[rank")))
    if rc == 0:
        return None
    if killed:
        return killed
    why = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    fatal = [line.strip() for line in lines if line.startswith("Fatal Python error")]
    frames = [line.strip() for line in lines if line.strip().startswith('File "') and __file__ in line]
    return f"process died ({why}): {fatal[0] if fatal else lines[-1] if lines else ''}" + \
        (f"; innermost frame of this script: {frames[0]}" if frames else "")


def merge(k, per_rank, reference):
    """One result row from the ranks' result files of case k (rank 0's view; same machine)."""
    label, mode, reg, _ = CASES[k]
    row = dict(mode=label, regularizer=reg, ok=False, error=None, grads_finite=None,
               max_abs_diff_vs_local_allreduced=None, seconds=None)
    recs = [r["rec"] for r in per_rank]
    row["ok"] = all(r["ok"] for r in recs)
    row["error"] = next((r["error"] for r in recs if r["error"]), None)
    if len({r["error"] for r in recs}) > 1:
        row["errors_per_rank"] = [r["error"] for r in recs]
    row["seconds"] = max(r["seconds"] for r in recs)
    row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in recs)
    for r in recs:
        if "grad_check_error" in r:
            row["grad_check_error"] = r["grad_check_error"]
    grads = [r["grads"] for r in per_rank]
    if any(g is None for g in grads):
        return row
    missing = sorted({n for g in grads for n, v in g.items() if v is None})
    row["grads_finite"] = not missing and all(bool(torch.isfinite(v).all()) for g in grads for v in g.values())
    row["missing_grads"] = missing
    if mode == "local":
        # the reference: the local gradients averaged over the ranks (what all_reduce / world gives)
        reference[reg] = {n: None if grads[0][n] is None else sum(g[n] for g in grads) / len(grads)
                          for n in grads[0]}
        return row
    ref = reference.get(reg)
    if ref is None or set(ref) != set(grads[0]):
        return row
    diffs = [float((g[n] - ref[n]).abs().max()) for g in grads for n in g
             if g[n] is not None and ref[n] is not None]
    row["max_abs_diff_vs_local_allreduced"] = max(diffs) if diffs else None
    row["ref_max_abs_grad"] = max(float(v.abs().max()) for v in ref.values() if v is not None)
    differ = sorted({n for g in grads for n in g if (g[n] is None) != (ref[n] is None)})
    if differ:
        row["grad_presence_differs_from_local"] = differ
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        return worker(args.worker, args.dir)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # the coordinators' group (torch.distributed.run's rendezvous)
    rank, world = dist.get_rank(), dist.get_world_size()
    shared = [None]
    if rank == 0:
        shared = [dict(dir=tempfile.mkdtemp(prefix="sg2_double_backward_"), store_port=free_port())]
    dist.broadcast_object_list(shared, src=0)
    outdir = shared[0]["dir"]
    store = dist.TCPStore("127.0.0.1", shared[0]["store_port"], world, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))

    crashes, start, tag = {}, 0, 0
    while start < len(CASES):
        port = [free_port() if rank == 0 else None]
        dist.broadcast_object_list(port, src=0)
        why = launch(start, outdir, rank, world, port[0], store, tag)
        whys = [None] * world
        dist.all_gather_object(whys, why)
        if all(w is None for w in whys):
            break
        # the case that was running: the first one without a result file on some rank
        k = next(k for k in range(start, len(CASES))
                 if not all(os.path.exists(os.path.join(outdir, f"case{k}_rank{r}.pt")) for r in range(world)))
        crashes[k] = [w for w in whys]
        start, tag = k + 1, tag + 1

    if rank == 0:
        results, reference = [], {}
        for k in range(len(CASES)):
            if k in crashes:
                label, _, reg, _ = CASES[k]
                errs = [w for w in crashes[k] if w and not w.startswith("killed")] or [w for w in crashes[k] if w]
                row = dict(mode=label, regularizer=reg, ok=False, error=errs[0][:300], grads_finite=None,
                           max_abs_diff_vs_local_allreduced=None, seconds=None, errors_per_rank=crashes[k])
            else:
                per_rank = [torch.load(os.path.join(outdir, f"case{k}_rank{r}.pt"), weights_only=False)
                            for r in range(world)]
                row = merge(k, per_rank, reference)
            results.append(row)
        order = {(m, r): i for i, (m, r) in enumerate((m, r) for m in MODES for r in REGULARIZERS)}
        results.sort(key=lambda r: order.get((r["mode"], r["regularizer"]), len(order)))
        report = {"torch": torch.__version__, "world_size": world, "results": results}
        text = json.dumps(report, indent=1)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    dist.barrier()
    if rank == 0:
        shutil.rmtree(outdir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
