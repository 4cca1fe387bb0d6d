#!/usr/bin/env bash
# Set up a fresh machine: system packages the tests need, then the core and every in-tree backend.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null; then SUDO=sudo; fi
if ! command -v gcc >/dev/null || ! echo 'int main(void){return 0;}' | gcc -fopenmp -x c - -o /dev/null 2>/dev/null; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends gcc libgomp1 libc6-dev
fi
# the compiled kernel launcher (tilecore/runtime/launcher.c) is built on first use with gcc against this Python's
# headers; a system Python keeps them in python3-dev (pyenv, conda and the python.org builds ship their own)
if ! python -c 'import os, sys, sysconfig; sys.exit(not any(os.path.exists(os.path.join(d or "", "Python.h")) for d in (sysconfig.get_config_var("INCLUDEPY"), sysconfig.get_paths()["include"])))'; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends python3-dev
fi
# WebGPU without a GPU: Mesa's lavapipe (a Vulkan driver on the CPU) for the webgpu backend's kernels
if ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends mesa-vulkan-drivers
fi
# HIP without ROCm: clang-22 builds AMDGPU code objects for gfx90a/gfx942/gfx950/gfx1100 (-nogpuinc -nogpulib),
# llvm-objdump-22 disassembles them (--emit asm, the HIP tests), rocm-device-libs gives ocml for math calls;
# the Metal tests use the same clang++-22 to check generated MSL against their metal_stdlib stand-in
if ! command -v clang++-22 >/dev/null || ! command -v llvm-objdump-22 >/dev/null || ! dpkg -s rocm-device-libs >/dev/null 2>&1; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends clang-22 lld-22 llvm-22 rocm-device-libs
fi
python -m pip install --upgrade pip >/dev/null
# torch: the pinned CPU build (an unpinned torch pulls a multi-GB CUDA build); kept out of package metadata
python -c "import torch" 2>/dev/null || python -m pip install "torch==2.13.0"
# einops: the references of the TileLang example corpus (tests/tilelang_corpus) use it, as TileLang's do
python -c "import einops" 2>/dev/null || python -m pip install einops
# every in-tree backend; the CUDA one with NVRTC (13.0, matching the H100's driver) and cuobjdump for --emit asm,
# so that CI compiles every conformance case for sm_80 and sm_90a without a GPU
# the WebGPU one (wgpu-py comes as its dependency), the Ascend one (its emulator needs only g++), the MUSA one
# (codegen-only here: its tests check the generated MUSA C++ with the clang-22 installed above, in CUDA mode against
# a stub header in backends/musa/tests/stub; no MUSA SDK exists on PyPI) and the Metal one (codegen-only off macOS:
# PyObjC's Metal is its macOS-only "runtime" extra); ".[test]" brings pytest, pytest-xdist, hypothesis and
# build (tests/test_wheels.py builds every wheel and installs them into fresh venvs)
# the TVM one pulls apache-tvm==0.27.0.post1 (about 305 MB) and apache-tvm-ffi; it reuses lld-22 and rocm-device-libs above
python -m pip install -e ".[test]" -e backends/cpu -e "backends/cuda[nvrtc]" -e backends/hip -e backends/webgpu -e backends/ascend -e backends/musa -e backends/metal -e backends/tvm -e conformance \
  "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*"
