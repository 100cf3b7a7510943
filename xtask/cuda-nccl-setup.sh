#!/usr/bin/env bash
# Adds what the `nccl` feature (atomrl-dist's NcclCollective, `atomrl-train --features
# cuda,mpi,nccl`) needs on top of the CUDA build environment, on a machine with no GPU: a
# libnccl.so to link against. Idempotent; source it AFTER the CUDA setup (shared/cuda/setup.sh,
# which provides nvcc, CUDA_ROOT, libcuda.so and the RUSTFLAGS this script extends):
#
#   source ../shared/cuda/setup.sh && source xtask/cuda-nccl-setup.sh
#   cargo build --release --features cuda,mpi,nccl --bin atomrl-train
#
# Why: cudarc is built with `dynamic-linking` (the mode candle's `cuda` feature picks, so a
# single cudarc serves both), whose build script emits `-lnccl` when its `nccl` feature is on:
# the linker needs libnccl.so at link time, not only at run time. No nccl.h is needed: cudarc's
# `nccl` feature selects its NCCL 2.30 bindings (no version detection).
#
# NCCL comes from NVIDIA's PyPI wheel for CUDA 13 (nvidia-nccl-cu13 2.30.7, ~216 MB; it matches
# cudarc's 2.30 bindings), installed into its own folder (`pip install --target` over the CUDA
# wheels' folder would replace their `nvidia/` package). The wheel ships only libnccl.so.2; the
# linker wants libnccl.so. The binary records the soname libnccl.so.2, so at run time any NCCL
# 2.x on the library path serves (the functions used exist in every 2.x): e.g. the GPU machine's
# PyTorch wheel, `python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))'`,
# added to LD_LIBRARY_PATH (shared/cuda/run-on-gpu.sh adds only nvidia/cu13/lib).
set -eo pipefail
ATOMRL_CUDA_DIR=${ATOMRL_CUDA_DIR:-$HOME/.cache/atomrl-cuda}
NCCL_WHEEL_VERSION=${NCCL_WHEEL_VERSION:-2.30.7}
NCCL_LIB=$ATOMRL_CUDA_DIR/nccl/nvidia/nccl/lib
if [ ! -e "$NCCL_LIB/libnccl.so" ]; then
  mkdir -p "$ATOMRL_CUDA_DIR/wheels"
  python3 -m pip download -q --no-deps -d "$ATOMRL_CUDA_DIR/wheels" "nvidia-nccl-cu13==$NCCL_WHEEL_VERSION"
  python3 -m pip install -q --no-deps --no-compile --upgrade --target "$ATOMRL_CUDA_DIR/nccl" \
    "$ATOMRL_CUDA_DIR"/wheels/nvidia_nccl_cu13-"$NCCL_WHEEL_VERSION"-*.whl
  ln -sf libnccl.so.2 "$NCCL_LIB/libnccl.so"
fi
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-L native=$NCCL_LIB"
export ATOMRL_NCCL_LIB=$NCCL_LIB
echo "nccl build env ready: $NCCL_LIB/libnccl.so -> libnccl.so.2 (nvidia-nccl-cu13 $NCCL_WHEEL_VERSION)"
