#!/usr/bin/env bash
# The L1, PSNR and SSIM of eval/image_quality.h against scikit-image's
# peak_signal_noise_ratio and structural_similarity, on noisy 3-channel images.
# Usage: image_quality_test.sh TEST_PIX2PIX CHECK_PY. Skips (77) without scikit-image.
set -euo pipefail
bin=$1 check=$2
py=${SHARDGAN_PYTHON:-python3}
if ! "$py" -c "import skimage" 2>/dev/null; then
  echo "SKIP: $py has no scikit-image (scripts/setup-dev.sh installs it)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
IMAGE_QUALITY_DIR=$dir mpirun -np 1 --oversubscribe "$bin" --gtest_filter='ImageQuality.*'
"$py" "$check" "$dir"
