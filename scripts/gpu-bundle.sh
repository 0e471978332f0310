#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs to run on a GPU machine that has a PyTorch with CUDA
# but none of our Debian packages and no network (a borrowed or locked-down node):
#   <out>/sg.tar.xz   shardgan-train, shardgan-data and tests/test_gpu from BUILD, built
#                     against the torch of that machine (same version: libshardgan links
#                     libtorch_cpu/libc10 by name), the shared libraries they need that are
#                     neither glibc, the C++ runtime, LibTorch nor CUDA/NCCL (those come from
#                     the machine's torch environment), and Open MPI's launcher (mpirun,
#                     orted), components and help files, and PMIx's plugins, relocated
#                     with OPAL_PREFIX (one host; the network transports stay behind);
#   <out>/fashion-mnist/  the training split of Fashion-MNIST;
#   <out>/env.sh      sourced there: unpacks sg.tar.xz to /tmp/sg and sets SHARDGAN_BUILD,
#                     SHARDGAN_DATA and SHARDGAN_SINGLETON for gpu-check.sh, and puts the
#                     relocated mpirun first on PATH.
# Usage: scripts/gpu-bundle.sh BUILD OUT    (docs/dev/gpu-bundle.md says how the GPU run used it)
set -euo pipefail
build=$(realpath "$1"); out=$2
mkdir -p "$out"; out=$(realpath "$out")
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/lib"
# Open MPI (Debian's 4.1 layout) under ompi/usr, as its installation under /usr: OPAL_PREFIX
# moves the prefix, and with it the components (Pkglibdir), help files (Pkgdatadir) and
# orted. Components for ranks on one host; the network transports (UCX, libfabric, verbs,
# PSM) stay behind with their libraries. PMIx (the launcher's server) keeps its own plugins
# and help files, moved by PMIX_INSTALL_PREFIX.
mlib=usr/lib/x86_64-linux-gnu
ompi=/$mlib/openmpi/lib/openmpi3
mkdir -p "$stage/ompi/usr/bin" "$stage/ompi$ompi" "$stage/ompi/usr/share" "$stage/ompi/$mlib/pmix2/lib"
for c in "$ompi"/*.so; do
  case $(basename "$c") in
    *ucx*|*ofi*|*psm*|*openib*|*uct*|*verbs*|*portals*|*usnic*) ;;
    *) cp -L "$c" "$stage/ompi$ompi/" ;;
  esac
done
# The launcher behind wrappers that put the carried libraries on its path (and on no other
# program's: the machine's own Python must keep its own libraries).
for b in orterun orted; do
  cp -L "/usr/bin/$b" "$stage/ompi/usr/bin/$b.bin"
  cat > "$stage/ompi/usr/bin/$b" <<'EOF'
#!/usr/bin/env bash
export LD_LIBRARY_PATH="/tmp/sg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec -a "$0" "$0.bin" "$@"
EOF
  chmod +x "$stage/ompi/usr/bin/$b"
done
ln -s orterun "$stage/ompi/usr/bin/mpirun"
ln -s orterun.bin "$stage/ompi/usr/bin/mpirun.bin"
cp -r /usr/share/openmpi "$stage/ompi/usr/share/"
cp -r "/$mlib/pmix2/lib/pmix" "$stage/ompi/$mlib/pmix2/lib/"
cp -r "/$mlib/pmix2/share" "$stage/ompi/$mlib/pmix2/"
wrap() {  # binary -> name.bin plus a wrapper that sets the library path
  local src=$1 dst=$2
  cp -L "$src" "$dst.bin"
  # argv[0] stays the wrapper's name: build/tests/test_gpu is a link to shardgan_tests, which
  # picks the cases to run by the name it is called by.
  cat > "$dst" <<'EOF'
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$SHARDGAN_LD_LIBRARY_PATH"
exec -a "$0" "$0.bin" "$@"
EOF
  chmod +x "$dst"
}
wrap "$build/shardgan-train" "$stage/build/shardgan-train"
wrap "$build/tests/test_gpu" "$stage/build/tests/test_gpu"
wrap "$build/shardgan-data" "$stage/build/shardgan-data"
ln -s test_gpu "$stage/build/tests/test_gpu_ranks"  # the binary runs the cases of the name it is called by
ln -s test_gpu.bin "$stage/build/tests/test_gpu_ranks.bin"
# Everything the binaries, the launcher and the components load, minus what the target brings itself.
{ ldd "$build/shardgan-train" "$build/tests/test_gpu" "$build/shardgan-data" "$stage"/ompi/usr/bin/* \
    "$stage/ompi$ompi"/*.so "$stage/ompi/$mlib"/pmix2/lib/pmix/*.so || true; } 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
  grep -vE '/torch/lib/|/nvidia/|/cuda[^/]*/' |
  while read -r l; do cp -L "$l" "$stage/lib/"; done
tar -C "$stage" -cf - build lib ompi | xz -T0 -6 > "$out/sg.tar.xz"
mkdir -p "$out/fashion-mnist"
cp /usr/share/datasets/fashion-mnist/train-*.gz "$out/fashion-mnist/"
cat > "$out/env.sh" <<'EOF'
# Sourced on the GPU machine (bash): unpack, then point gpu-check.sh at the bundle.
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/sg && tar -C /tmp/sg -xJf "$_b/sg.tar.xz"
_py=${SHARDGAN_PYTHON:-$(command -v python3)}
_site=$("$_py" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
_nv=$(ls -d "$_site"/nvidia/*/lib "$_site"/nvidia/cu*/lib 2>/dev/null | sort -u | tr '\n' ':')
export SHARDGAN_LD_LIBRARY_PATH="$_site/torch/lib:${_nv}/usr/local/cuda/lib64:/tmp/sg/lib"
export SHARDGAN_BUILD=/tmp/sg/build SHARDGAN_DATA="$_b/fashion-mnist" SHARDGAN_SINGLETON=1 SHARDGAN_PYTHON="$_py"
# 1-rank cells start a singleton rank (no mpirun, no orted); the others the mpirun carried here.
_m=/tmp/sg/ompi/usr/lib/x86_64-linux-gnu
export OPAL_PREFIX=/tmp/sg/ompi/usr PMIX_INSTALL_PREFIX=$_m/pmix2 PATH=/tmp/sg/ompi/usr/bin:$PATH
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_path=$_m/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$_m/pmix2/lib/pmix
export OMPI_MCA_mca_base_component_show_load_errors=0
# One host: shared memory and self only, without the single-copy (CMA) mechanism that some
# sandboxes refuse.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
EOF
du -sh "$out"/*
