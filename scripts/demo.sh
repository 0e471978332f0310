#!/usr/bin/env bash
# The main job from a fresh machine: install what is missing, build, train the FID
# classifier once (runs/fmnist-classifier.h5; its time is in docs/results.md), and train the ZeRO-3 DCGAN
# on Fashion-MNIST with 2 ranks, with FID evaluations, plots and an end-of-run summary.
# Extra arguments go to shardgan-train (e.g. scripts/demo.sh --set train.steps=200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh shardgan-train shardgan-ckpt shardgan-fid
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Fashion-MNIST's folder: Debian's (the config's data.path), or SHARDGAN_FMNIST_DIR where the
# four idx .gz files were put without root (docs/install.md).
FMNIST=${SHARDGAN_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
CLASSIFIER=runs/fmnist-classifier.h5
if [ ! -f "$CLASSIFIER" ]; then
  mkdir -p runs
  build/shardgan-fid train-classifier --data "$FMNIST" -o "$CLASSIFIER"
fi
NP=${NP:-2}
exec mpirun -np "$NP" --oversubscribe --bind-to none build/shardgan-train configs/fmnist-dcgan.yaml \
  --set data.path="$FMNIST" --set eval.reference="$FMNIST" \
  --set eval.enabled=true --set eval.classifier="$CLASSIFIER" "$@"
