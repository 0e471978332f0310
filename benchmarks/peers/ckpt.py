"""Reading a shardgan checkpoint (schema 2, docs/checkpoints.md) with h5py alone."""
import os

import h5py
import torch
import yaml


def read_config(ckpt_dir):
    """The run's resolved config: the index's `config` attribute, one `key: value` a line,
    as a dict of flat keys ("model.ch") to YAML-parsed values."""
    with h5py.File(os.path.join(ckpt_dir, "index.h5"), "r") as f:
        text = f.attrs["config"]
        step = int(f.attrs["step"])
    if isinstance(text, bytes):
        text = text.decode()
    cfg = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, _, value = line.partition(": ")
        cfg[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    cfg["_step"] = step
    return cfg


def noise_state(ckpt_dir):
    """The latent generator's state (`/rng/noise` of rank 0's file): a torch.Generator state."""
    with h5py.File(os.path.join(ckpt_dir, "rank-00000.h5"), "r") as f:
        return torch.from_numpy(f["rng/noise"][...])


def count_params(ckpt_dir):
    """Parameters of G and D, from the checkpoint's full-tensor datasets."""
    n = {}
    with h5py.File(os.path.join(ckpt_dir, "index.h5"), "r") as f:
        for model in ("generator", "discriminator"):
            n[model] = sum(int(ds.size) for ds in f[model + "/params"].values())
    return n


def _copy(t, ds):
    """ds (a full tensor in the checkpoint) into t: all of it, or for an FSDP2 parameter (a
    DTensor sharded on dim 0, torch.chunk's layout: ceil(rows / N) rows per rank) only this
    rank's rows, so that no rank ever holds the whole model."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        (placement,) = t.placements
        assert placement.is_shard(0), f"expected dim-0 sharding, got {t.placements}"
        local = t.to_local()
        n, world, rank = t.shape[0], t.device_mesh.size(), t.device_mesh.get_local_rank()
        rows = -(-n // world)
        start, stop = min(rank * rows, n), min((rank + 1) * rows, n)
        assert local.shape[0] == stop - start, (t.shape, local.shape, start, stop)
        if stop > start:
            local.copy_(torch.from_numpy(ds[start:stop]).to(local.dtype))
    else:
        t.copy_(torch.from_numpy(ds[...]).to(t.dtype))


def load_into(module, ckpt_dir, model, skip=None):
    """Copies `<model>/params/<name>` and `<model>/buffers/<name>` of the checkpoint into the
    module's parameters and buffers of the same names. Every tensor of the module must be in
    the checkpoint with its shape, and every tensor of the checkpoint must be used: this is
    what checks that the copy has shardgan's architecture. `skip` names one tensor to leave
    as it is (a negative control)."""
    with h5py.File(os.path.join(ckpt_dir, "index.h5"), "r") as f:
        stored = {}
        for kind in ("params", "buffers"):
            grp = f.get(f"{model}/{kind}")
            if grp is not None:
                for name in grp:
                    stored[name] = (kind, grp[name])
        used = set()
        with torch.no_grad():
            tensors = list(module.named_parameters()) + list(module.named_buffers())
            for name, t in tensors:
                if name not in stored:
                    raise KeyError(f"{model}: {name} {tuple(t.shape)} is not in {ckpt_dir}")
                ds = stored[name][1]
                if tuple(ds.shape) != tuple(t.shape):
                    raise ValueError(f"{model}: {name} has shape {tuple(t.shape)} here and {ds.shape} in the checkpoint")
                if name != skip:
                    _copy(t, ds)
                used.add(name)
        missing = sorted(set(stored) - used)
        if missing:
            raise KeyError(f"{model}: checkpoint tensors with no counterpart in the PyTorch copy: {missing[:8]}")
    return len(used)
