"""Turns one shardgan-train run of the peer benchmark into the benchmark's JSON line.

    collect_shardgan.py RUN_DIR --ckpt STEP0_CKPT --model NAME --stage S --world-size N [--out F]

Step times and losses come from RUN_DIR/metrics.jsonl (train.log_every 1: step_time_s is
rank 0's wall time of the step). vmhwm_gib is the largest per-rank VmHWM of
RUN_DIR/memory.json, which each rank reads from /proc/self/status at the end of the run,
after the final checkpoint and sample grid (the trainer always writes both); the rank-0
VmHWM after the last step, from metrics.jsonl, is kept as vmhwm_gib_rank0_last_step.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt  # noqa: E402
import tolerance  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--stage", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--out")
    p.add_argument("--note", default="")
    a = p.parse_args()
    steps = [json.loads(l) for l in open(os.path.join(a.run_dir, "metrics.jsonl")) if '"loss_d"' in l]
    steps.sort(key=lambda r: r["step"])
    mem = json.load(open(os.path.join(a.run_dir, "memory.json")))
    n = ckpt.count_params(a.ckpt)
    cfg = ckpt.read_config(a.ckpt)
    r1, s = tolerance.loss_rtol_step1(cfg)
    times = [r["step_time_s"] for r in steps]
    gib = [b / 2**30 for b in mem["peak_rss_bytes_per_rank"]]
    rec = {"system": "shardgan", "model": a.model, "params": n["generator"] + n["discriminator"],
           "params_g": n["generator"], "params_d": n["discriminator"],
           "world_size": a.world_size, "stage": a.stage,
           "step_s": statistics.median(times[2:10]) if len(times) >= 3 else None,
           "vmhwm_gib": max(gib), "vmhwm_gib_per_rank": gib,
           "vmhwm_gib_rank0_last_step": steps[-1]["peak_rss_bytes_rank0"] / 2**30 if steps else None,
           "losses": [[r["loss_d"], r["loss_g"]] for r in steps], "step_times_s": times, "steps": len(steps),
           "time_collective_s": [r.get("time_collective_s") for r in steps],
           "global_batch": int(cfg["train.global_batch"]), "d_steps": int(cfg.get("train.d_steps", 1)),
           "loss": cfg.get("train.loss"), "loss_rtol_step1": r1, "reduction_sqrt_sum": s,
           "note": a.note}
    if cfg.get("model.arch") == "stylegan2":
        # the regularization figures of each step: r1 (0 on steps without D reg), pl (only on
        # steps with G reg), pl_mean; None where metrics.jsonl has none
        rec["reg_losses"] = [[r.get("r1"), r.get("pl"), r.get("pl_mean")] for r in steps]
        rec["reg_rtol_step1"] = tolerance.reg_rtol_step1(cfg)
        # On a GPU: cudaMemGetInfo's bytes in use after each step (context included), largest
    used = [r["device_mem_used_bytes"] for r in steps if "device_mem_used_bytes" in r]
    rec.update({"backend": "nccl", "device": "cuda", "cuda_used_after_step_mib": max(used) // 2**20} if used
               else {"backend": "mpi", "device": "cpu"})
    line = json.dumps(rec)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
