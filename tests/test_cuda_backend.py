"""The CUDA backend (tilecore-cuda), through the public API only.

On a machine without a GPU (CI) the backend compiles with NVRTC or nvcc and reports ``compile-only``;
on a GPU machine the same tests also run the kernels and compare with references computed on the host
in float64. Tests that need a CUDA compiler skip when none is installed, unless
``TILECORE_CUDA_REQUIRE_TOOLCHAIN=1`` (set it in CI once the compiler is part of the setup).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from kernels_for_tests import matmul_relu
from tilecore.errors import DeviceError, KernelAssertionError

tilecore_cuda = pytest.importorskip("tilecore_cuda")


def _probe():
    return tilecore_cuda.CUDABackend().probe()


PROBE = _probe()
HAS_TOOLCHAIN = PROBE.status != "no-toolchain"
HAS_DEVICE = PROBE.status == "ok"

needs_toolchain = pytest.mark.skipif(
    not HAS_TOOLCHAIN and os.environ.get("TILECORE_CUDA_REQUIRE_TOOLCHAIN") != "1",
    reason="no CUDA compiler here (pip install 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-runtime==13.0.*' "
           "'cuda-bindings==13.0.*', or nvcc on PATH)")
ARCHS = ["cuda:sm_80", "cuda:sm_90a"]
NOCACHE = {"tilecore.disable_cache": True}


# -- kernels ------------------------------------------------------------------------------------------

def softmax(M, N, blk_m, dtype="float32", accum="float32"):
    scale = 1.4426950408889634

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            x_s = T.alloc_shared((blk_m, N), dtype)
            x = T.alloc_fragment((blk_m, N), accum)
            row_max = T.alloc_fragment((blk_m,), accum)
            row_sum = T.alloc_fragment((blk_m,), accum)
            T.copy(X[bx * blk_m, 0], x_s)
            T.copy(x_s, x)
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = T.exp2(x[i, j] * scale - row_max[i] * scale)
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(blk_m, N):
                x[i, j] = x[i, j] / row_sum[i]
            T.copy(x, Y[bx * blk_m, 0])

    return main


def scatter_atomics(n, bins, blk, dtype):
    @T.prim_func
    def main(Idx: T.Tensor((n,), "int32"), X: T.Tensor((n,), dtype), Sum: T.Tensor((bins,), dtype),
             Max: T.Tensor((bins,), dtype), Min: T.Tensor((bins,), dtype)):
        with T.Kernel(T.ceildiv(n, blk)) as bx:
            for i in T.Parallel(blk):
                g = bx * blk + i
                if g < n:
                    T.atomic_add(Sum[Idx[g]], X[g])
                    T.atomic_max(Max[Idx[g]], X[g])
                    T.atomic_min(Min[Idx[g]], X[g])

    return main


def add_dynamic_tiles(bm, bn, dtype="float16"):
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            a = T.alloc_fragment((bm, bn), "float32")
            b = T.alloc_fragment((bm, bn), dtype)
            T.copy(A[by * bm, bx * bn], a)
            T.copy(B[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], b)
            for i, j in T.Parallel(bm, bn):
                a[i, j] = T.max(a[i, j], b[i, j]) - T.min(a[i, j], 0)
            T.copy(a, C[by * bm, bx * bn])

    return main


def assert_kernel(n, blk):
    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, blk), threads=32) as bx:
            for i in T.Parallel(blk):
                if bx * blk + i < n:
                    T.device_assert(X[bx * blk + i] >= 0, "X must be non-negative")
                    Y[bx * blk + i] = T.sqrt(X[bx * blk + i])

    return main


def block_scalar_kernel(n):
    """Block-level scalar statements (a T.alloc_var, a serial loop, a store) must run once per block."""

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Out: T.Tensor((1,), "float32")):
        with T.Kernel(1, threads=64) as bx:
            acc = T.alloc_var("float32", init=0.0)
            for k in T.serial(n):
                acc[0] = acc[0] + X[k]
            Out[0] = acc[0]

    return main


def expected_mode(target: str) -> str:
    """device only where the GPU can run this arch's cubins (sm_80 SASS does not load on an sm_90 GPU)."""
    from tilecore_cuda.runtime import arch_of, device_properties, runs_on

    return ("device" if HAS_DEVICE and runs_on(target.split(":")[1], arch_of(device_properties(0)))
            else "compile-only")


# -- compile-only checks (every machine with a compiler) -----------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
def test_readme_gemm_compiles(target):
    k = tilecore.compile(matmul_relu(1000, 512, 256, 64, 64, 32), target=target, out_idx=[-1],
                         pass_configs=NOCACHE)
    src = k.get_kernel_source()
    assert k.mode == expected_mode(target)
    assert 'extern "C" __global__' in src and "__syncthreads()" in src and "__shared__" in src
    assert "threadIdx.x" in src and "blockIdx.y" in src
    # tensor cores: C in registers on the mma.sync unit, on wgmma where the target has it
    # (test_cuda_tensor_cores.py has both mma.sync gemm paths, test_cuda_wgmma_unit.py the wgmma one)
    unit = "wgmma_m64n64k16.C" if target == "cuda:sm_90a" else "mma_sync_m16n8k16.C"
    assert k.meta["attrs"]["fragment_layouts"]["C_local"].startswith(unit)
    # the general path everywhere: sm_90a (64 columns: the register program's WGMMA on 64-byte tiles is no faster
    # there, D47) and the mma.sync targets, where the GEMM form leaves the register program since D63 (measured
    # faster on the general path); forced, sm_80 runs it as a register program (its 64-byte A tile, D47)
    assert tilecore_cuda.lowering_path(k) == "generic"
    if target != "cuda:sm_90a":
        forced = tilecore.compile(matmul_relu(1000, 512, 256, 64, 64, 32), target=target, out_idx=[-1],
                                  pass_configs={**NOCACHE, "tilecore.cuda.register_programs": True})
        assert tilecore_cuda.lowering_path(forced) == "register program (mma.sync)"
    assert k.source.meta["threads"] == 128


@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
def test_softmax_atomic_dynamic_compile(target):
    for fn in (softmax(64, 128, 16), softmax(33, 96, 8, "float16"), scatter_atomics(1000, 7, 64, "float32"),
               scatter_atomics(1000, 7, 64, "float16"), add_dynamic_tiles(16, 32), assert_kernel(50, 16),
               block_scalar_kernel(10)):
        k = tilecore.compile(fn, target=target, pass_configs=NOCACHE)
        assert k.mode == expected_mode(target)
        assert "__syncthreads" in k.get_kernel_source()


def _copy_kernel(src_dtype, dst_dtype, via=None):
    @T.prim_func
    def main(A: T.Tensor((256,), src_dtype), B: T.Tensor((256,), dst_dtype)):
        with T.Kernel(2, threads=128) as bx:
            for i in T.Parallel(128):
                v = A[bx * 128 + i]
                B[bx * 128 + i] = T.cast(T.cast(v, via), dst_dtype) if via else v
    return main


@needs_toolchain
def test_cuda_fp8_and_bf16_headers_only_in_kernels_that_use_them():
    """cuda_fp8.h and cuda_bf16.h are 26 ms of NVRTC's front end: left out unless the kernel's text has the
    type (a parameter, or a conversion inside); those kernels still include them and compile (D25)."""
    plain = tilecore.compile(_copy_kernel("float16", "float32"), target="cuda:sm_90a", pass_configs=NOCACHE)
    src = plain.get_kernel_source()
    assert "#include <cuda_fp16.h>" in src
    assert "#include <cuda_fp8.h>" not in src and "#include <cuda_bf16.h>" not in src
    for fn, header in ((_copy_kernel("float8_e4m3", "float32"), "cuda_fp8.h"),
                       (_copy_kernel("float32", "float32", via="float8_e5m2"), "cuda_fp8.h"),
                       (_copy_kernel("bfloat16", "float32"), "cuda_bf16.h"),
                       (_copy_kernel("float32", "float32", via="bfloat16"), "cuda_bf16.h"),
                       (_copy_kernel("float32", "bfloat16"), "cuda_bf16.h")):
        k = tilecore.compile(fn, target="cuda:sm_90a", pass_configs=NOCACHE)
        assert f"#include <{header}>" in k.get_kernel_source() and k.binary


@needs_toolchain
def test_atomics_and_dynamic_grid_spelling():
    k = tilecore.compile(scatter_atomics(1000, 7, 64, "float32"), target="cuda:sm_80", pass_configs=NOCACHE)
    src = k.get_kernel_source()
    assert "tc_atomic_add_float32" in src and "atomicAdd" in src and "atomicCAS" in src
    k = tilecore.compile(add_dynamic_tiles(16, 32), target="cuda:sm_80", pass_configs=NOCACHE)
    assert any("ints[" in g for g in k.source.meta["grid"])  # the grid is computed from the shapes at launch


@needs_toolchain
def test_large_shared_memory_goes_dynamic():
    k = tilecore.compile(softmax(32, 512, 32), target="cuda:sm_90a", pass_configs=NOCACHE)  # 128 KiB
    assert "extern __shared__" in k.get_kernel_source()
    assert k.source.meta["dynamic_shared_bytes"] > 48 * 1024


@needs_toolchain
def test_the_runtime_builds_through_its_compiler_without_a_device():
    # the compiler/driver split: CUDARuntime.build delegates to a tilecore.plugin.Compiler, which needs no GPU
    from tilecore.compiler import lower
    from tilecore.errors import CompileError
    from tilecore.plugin import Compiler, get_registry

    backend, tgt = get_registry().resolve("cuda:sm_80")
    rt = backend.runtime(tgt)
    assert isinstance(rt.compiler, Compiler) and rt.compiler.arch == "sm_80"
    assert rt.compiler.version() == backend.toolchain_version(tgt) != ""
    source = lower(softmax(64, 128, 16), "cuda:sm_80")[3]
    assert rt.compiler.compile(source, {})[:4] == b"\x7fELF"
    with pytest.raises(CompileError, match="must be 'nvrtc' or 'nvcc'"):
        rt.build(source, {"tilecore.cuda.compiler": "clang"})


@needs_toolchain
def test_nvcc_and_nvrtc_agree_when_both_exist():
    from tilecore_cuda import runtime as rt

    if not (rt.nvrtc_usable() and rt.find_nvcc()):
        pytest.skip("needs both NVRTC and nvcc")
    for compiler in ("nvrtc", "nvcc"):
        k = tilecore.compile(softmax(64, 128, 16), target="cuda:sm_90a",
                             pass_configs={**NOCACHE, "tilecore.cuda.compiler": compiler})
        assert k.binary[:4] == b"\x7fELF"


@pytest.mark.skipif(HAS_DEVICE, reason="checks the no-GPU behaviour")
@needs_toolchain
def test_call_without_gpu_raises_device_error():
    k = tilecore.compile(matmul_relu(128, 128, 64, 64, 64, 32), target="cuda:sm_80", out_idx=[-1])
    assert k.mode == "compile-only"
    with pytest.raises(DeviceError, match="no CUDA device"):
        k(np.zeros((128, 64), np.float16), np.zeros((64, 128), np.float16))


def test_targets_list_json_shows_cuda():
    out = subprocess.run([sys.executable, "-m", "tilecore", "targets", "list", "--json"], capture_output=True,
                         text=True, check=True).stdout
    rows = json.loads(out)
    rows = rows if isinstance(rows, list) else rows.get("targets", rows)
    cuda = [r for r in rows if str(r.get("target", "")).startswith("cuda")]
    assert {r["target"] for r in cuda} >= {"cuda:sm_80", "cuda:sm_86", "cuda:sm_89", "cuda:sm_90a"}
    want = "ok" if HAS_DEVICE else ("no-device" if HAS_TOOLCHAIN else "no-toolchain")
    assert all(r["status"] == want for r in cuda), cuda


def test_bare_cuda_target_is_local_arch_or_sm_90a():
    t = tilecore_cuda.CUDABackend().parse_target("cuda")
    assert t.arch in tilecore_cuda.ARCHS
    if not HAS_DEVICE:
        assert t.arch == "sm_90a"
    assert tilecore_cuda.CUDABackend().parse_target("cpu") is None


def test_core_has_no_vendor_names_after_simt_pass():
    from pathlib import Path

    text = (Path(tilecore.__file__).parent / "passes" / "simt.py").read_text().lower()
    for word in ("cuda", "nvidia", "ptx", "__syncthreads"):
        assert word not in text


# -- device checks (GPU machines only) -----------------------------------------------------------------

gpu = pytest.mark.skipif(not HAS_DEVICE, reason="no CUDA device")


@pytest.fixture
def torch_cuda():
    import torch

    return torch


def _t(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


@gpu
def test_gemm_runs(torch_cuda):
    torch = torch_cuda
    rng = np.random.default_rng(0)
    k = tilecore.compile(matmul_relu(1000, 512, 256, 64, 64, 32), target="cuda", out_idx=[-1])
    a = rng.standard_normal((1000, 256)).astype(np.float16)
    b = rng.standard_normal((256, 512)).astype(np.float16)
    c = k(_t(torch, a), _t(torch, b)).cpu().numpy().astype(np.float64)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    assert (np.abs(c - ref) <= 1e-3 * np.abs(ref) + 1e-2).all()


@gpu
@pytest.mark.parametrize("M,N,blk,dtype", [(64, 128, 16, "float32"), (50, 77, 16, "float32"), (33, 96, 8, "float16"),
                                           (32, 512, 32, "float32")])
def test_softmax_runs(torch_cuda, M, N, blk, dtype):
    torch = torch_cuda
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((M, N)) * 4).astype(dtype)
    k = tilecore.compile(softmax(M, N, blk, dtype), target="cuda", out_idx=[-1])
    y = k(_t(torch, x)).float().cpu().numpy().astype(np.float64)
    xr = x.astype(np.float64)
    e = np.exp(xr - xr.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    assert np.abs(y - ref).max() <= (2e-3 if dtype == "float16" else 1e-5)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_atomics_run(torch_cuda, dtype):
    torch = torch_cuda
    rng = np.random.default_rng(2)
    n, bins = 1000, 7
    idx = rng.integers(0, bins, n).astype(np.int32)
    if dtype == "int32":
        x = rng.integers(-50, 50, n).astype(np.int32)
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    else:
        x = rng.standard_normal(n).astype(dtype)
        lo, hi = -np.inf, np.inf
    S, Mx, Mn = (_t(torch, np.zeros(bins, dtype)), _t(torch, np.full(bins, lo, dtype)),
                 _t(torch, np.full(bins, hi, dtype)))
    k = tilecore.compile(scatter_atomics(n, bins, 64, dtype), target="cuda")
    k(_t(torch, idx), _t(torch, x), S, Mx, Mn)
    S, Mx, Mn = S.cpu().numpy(), Mx.cpu().numpy(), Mn.cpu().numpy()
    xs = x.astype(np.float64)
    for b in range(bins):
        sel = xs[idx == b]
        assert abs(S[b] - sel.sum()) <= 1e-4 * (1 + np.abs(sel).sum())
        assert Mx[b] == sel.max() and Mn[b] == sel.min()


@gpu
@pytest.mark.parametrize("M,N", [(1, 1), (37, 1), (33, 65), (100, 200), (0, 5)])
def test_dynamic_shapes_run(torch_cuda, M, N):
    torch = torch_cuda
    rng = np.random.default_rng(3)
    k = tilecore.compile(add_dynamic_tiles(16, 32), target="cuda")
    a = rng.standard_normal((M, N)).astype(np.float16)
    b = rng.standard_normal((M, N)).astype(np.float16)
    c = _t(torch, np.full((M, N), np.nan, np.float16))
    k(_t(torch, a), _t(torch, b), c)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(c.cpu().numpy().astype(np.float64), np.maximum(a64, b64) - np.minimum(a64, 0),
                               rtol=1e-3, atol=1e-3)


@gpu
def test_device_assert_runs(torch_cuda):
    torch = torch_cuda
    k = tilecore.compile(assert_kernel(50, 16), target="cuda")
    x = np.random.default_rng(4).uniform(0, 4, 50).astype(np.float32)
    y = _t(torch, np.zeros(50, np.float32))
    k(_t(torch, x), y)
    np.testing.assert_allclose(y.cpu().numpy(), np.sqrt(x), rtol=1e-6)
    x[37] = -1.0
    with pytest.raises(KernelAssertionError, match="X must be non-negative"):
        k(_t(torch, x), y)
    x[37] = 1.0
    k(_t(torch, x), y)  # the failure leaves no state behind


@gpu
def test_block_scalars_run_once(torch_cuda):
    torch = torch_cuda
    x = np.arange(10, dtype=np.float32)
    out = _t(torch, np.zeros(1, np.float32))
    tilecore.compile(block_scalar_kernel(10), target="cuda")(_t(torch, x), out)
    assert float(out.cpu()[0]) == 45.0


@needs_toolchain
@pytest.mark.parametrize("target", ARCHS)
def test_conformance_catalog(tmp_path, target):
    """The whole catalog, as a vendor's CI runs it: compile-only here, device mode where a GPU is."""
    proc = subprocess.run([sys.executable, "-m", "tilecore", "conformance", "run", "--target", target, "-n", "2",
                           "--report", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    res = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    states = [x["state"] for x in res]
    assert len(res) >= 340 and states.count("PASS") >= 300
    assert set(states) <= {"PASS", "NOT_SUPPORTED", "EXPECTED_FAIL"}, set(states)
    mode = expected_mode(target)
    assert {x["mode"] for x in res} == {mode}
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["mode"] == mode and man["capability_profile"] == "cuda/" + target.split(":")[1]


@needs_toolchain
def test_emit_asm_through_cuobjdump(tmp_path):
    import shutil as _sh
    from pathlib import Path

    try:
        import nvidia  # type: ignore

        bundled = any(any(Path(r).glob("*/bin/cuobjdump")) for r in nvidia.__path__)
    except ImportError:
        bundled = False
    if not (_sh.which("cuobjdump") or bundled) and os.environ.get("TILECORE_CUDA_REQUIRE_TOOLCHAIN") != "1":
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    src = tmp_path / "kern.py"
    src.write_text(
        "import tilecore.language as T\n"
        "def vadd(n):\n"
        "    @T.prim_func\n"
        "    def main(A: T.Tensor((n,), 'float32'), B: T.Tensor((n,), 'float32')):\n"
        "        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:\n"
        "            for i in T.Parallel(128):\n"
        "                if bx * 128 + i < n:\n"
        "                    B[bx * 128 + i] = A[bx * 128 + i] * 2\n"
        "    return main\n")
    proc = subprocess.run([sys.executable, "-m", "tilecore", "compile", f"{src}:vadd", "--args", "1000", "--target",
                           "cuda:sm_90a", "--emit", "asm"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "tc_kernel" in proc.stdout and "EXIT" in proc.stdout


def test_binary_compatibility_rule():
    from tilecore_cuda.runtime import runs_on

    assert runs_on("sm_80", "sm_86") and runs_on("sm_86", "sm_86") and runs_on("sm_90a", "sm_90a")
    assert not runs_on("sm_80", "sm_90a") and not runs_on("sm_86", "sm_80") and not runs_on("sm_90a", "sm_100a")
