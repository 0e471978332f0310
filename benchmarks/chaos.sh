#!/usr/bin/env bash
# The chaos campaign: random faults (kill -9, SIGTERM/SIGUSR1 to one rank or all, fsync and
# offload I/O errors, a full disk, a hung checkpoint writer, a cut link between two
# namespaced hosts) at random times in random valid configurations (benchmarks/chaos_cells.py),
# each followed by checks: every rank exits within 60 s naming the cause, every committed
# checkpoint verifies, --resume auto picks the newest one and completes, and deterministic
# cells end bit for bit on the uninterrupted run. One JSON line per trial in
# benchmarks/results/chaos.jsonl; rerunning skips trials already there. Needs root for the
# full disk (a tmpfs) and the second host (ip netns); without it those are not drawn.
#   benchmarks/chaos.sh [--seed S] [--trials N] [--max-minutes M] [--trial I ...] [--keep]
#   benchmarks/chaos.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=${SHARDGAN_PYTHON:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
exec "$PY" benchmarks/chaos.py "$@"
