#!/usr/bin/env python3
"""BigGAN's self-attention core, bmm-softmax-bmm (what src/models/biggan/layers.cpp runs)
against at::scaled_dot_product_attention with scale 1 (BigGAN does not scale by 1/sqrt(d)),
forward + backward, one thread, in the project's environment (the same ATen kernels as the
LibTorch that shardgan links). Prints one JSON line per shape: seconds per fwd+bwd (best of
5 rounds of 5) and the largest difference of the output and of each input gradient, relative
to the largest magnitude.

    .venv/bin/python benchmarks/attention_sdpa.py
"""
import json
import time

import torch
import torch.nn.functional as F


def bmm_attention(th, ph, gg):  # th [B, c/8, hw], ph [B, c/8, hw/4], gg [B, c/2, hw/4]
    beta = torch.softmax(torch.bmm(th.transpose(1, 2), ph), -1)
    return torch.bmm(gg, beta.transpose(1, 2))


def sdpa_attention(th, ph, gg):
    q, k, v = (t.transpose(1, 2).unsqueeze(1) for t in (th, ph, gg))
    return F.scaled_dot_product_attention(q, k, v, scale=1.0).squeeze(1).transpose(1, 2)


def main():
    torch.set_num_threads(1)
    # (batch, channels, h*w): the demo BigGAN's 16x16 attention at 32 images per rank, and the
    # 1e9 config's 32x32 G attention (64 channels) and a wide 32x32 case.
    for b, ch, hw, dt in [(32, 64, 256, torch.float32), (32, 64, 256, torch.float64),
                          (2, 64, 1024, torch.float32), (2, 1024, 1024, torch.float32)]:
        torch.manual_seed(0)
        th = torch.randn(b, ch // 8, hw, dtype=dt, requires_grad=True)
        ph = torch.randn(b, ch // 8, hw // 4, dtype=dt, requires_grad=True)
        gg = torch.randn(b, ch // 2, hw // 4, dtype=dt, requires_grad=True)
        go = torch.randn(b, ch // 2, hw, dtype=dt)
        res, out = {}, {}
        for name, f in (("bmm", bmm_attention), ("sdpa", sdpa_attention)):
            best = 1e30
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(5):
                    o = f(th, ph, gg)
                    g = torch.autograd.grad(o, (th, ph, gg), go)
                best = min(best, (time.perf_counter() - t0) / 5)
            res[name + "_s"] = best
            out[name] = (o.detach(), g)
        (o1, g1), (o2, g2) = out["bmm"], out["sdpa"]
        rel = lambda a, c: ((a - c).abs().max() / a.abs().max()).item()  # noqa: E731
        res.update(batch=b, channels=ch, hw=hw, dtype=str(dt).replace("torch.", ""),
                   sdpa_over_bmm=res["sdpa_s"] / res["bmm_s"], out_rel_diff=rel(o1, o2),
                   grad_rel_diff=max(rel(a, c) for a, c in zip(g1, g2)))
        print(json.dumps(res))


if __name__ == "__main__":
    main()
