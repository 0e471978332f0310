"""VmHWM of a peer process that has only imported torch and h5py and joined the gloo process
group: what every PyTorch rank pays before it holds any model (the CUDA build of torch maps
its CUDA libraries even on a machine without a GPU). Run: torchrun --nproc_per_node N baseline.py"""
import os

import h5py  # noqa: F401
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
print(f"rank {dist.get_rank()}: VmHWM {hwm / 2**20:.3f} GiB after import torch, h5py and init_process_group(gloo)", flush=True)
dist.barrier()
os._exit(0)
