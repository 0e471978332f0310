# Helpers for the checkpoint shell tests: a tiny synthetic run.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=${SHARDGAN_PYTHON:?set by ctest: the .venv Python with h5py and numpy}
SMALL=(--set ema.start_step=0 --set data.source=synthetic --set data.synthetic_size=96 --set train.global_batch=12
       --set model.z_dim=16 --set model.g_width=8 --set model.d_width=8 --set train.log_every=1
       --set train.sample_every=0 --set run.seed=5)
