"""Where a kernel call's host time goes, without a GPU (issue 17's host rows; D23, D57):

    python benchmarks/host_launch_profile.py [--calls 40000] [--repeat 7]

The CUDA backend's program of a 3-tensor 4096-element add (``benchmarks/cuda_gemm.vadd``, compiled for
cuda:sm_90a: NVRTC runs without a GPU) is loaded with a no-op C function in place of ``cuLaunchKernel``,
C builtins in place of torch's current-device and current-stream queries, and CPU tensors standing in for
device tensors (the tensor flag is ``is_cpu``). Each row is thread CPU time per call (best of ``--repeat``
loops of ``--calls``; the machine may be shared, so wall time is not used), less an empty loop's, in one
process:

- ``kernel(x, y, z)`` through each path: the Python binder (``TILECORE_C_LAUNCHER=0``, D19), the compiled
  launcher reading tensors through torch's getters (D23: ``TILECORE_C_LAUNCHER=getters``), and through torch's
  C shim (D57, the default);
- the launcher alone (its call with the argument tuple), for 3 tensors and for 1 (a 1-tensor kernel);
- torch's own tensor getters and methods the launcher reads, each alone through Python.

The driver's own cuLaunchKernel is not here (no GPU): ``benchmarks/host_costs.py`` times it on the device.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent

NOOP = "int noop_launch(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned s, " \
       "void *st, void **p, void **x) { return 0; }\n"


def noop_launch():
    """The address of a C function of cuLaunchKernel's shape that returns 0 (built with the host cc)."""
    folder = Path(tempfile.mkdtemp(prefix="tilecore-noop-"))
    (folder / "noop.c").write_text(NOOP)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(folder / "noop.c"), "-o", str(folder / "noop.so")],
                   check=True)
    lib = ctypes.CDLL(str(folder / "noop.so"))
    return lib, lib.noop_launch


def per_call_ns(fn, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / calls)
    return best


def cpu_kernel(kernel, mode: str, launch_fn):
    """``kernel`` (a fresh JITKernel) on a CUDAProgram that takes CPU tensors and launches through ``launch_fn``;
    ``mode`` the value of TILECORE_C_LAUNCHER at its first call."""
    import types

    import torch
    from tilecore.compiler.kernel import JITKernel
    from tilecore_cuda import runtime as cuda_runtime

    k = JITKernel(kernel.meta, kernel.binary, kernel.backend, kernel.target)
    rt = cuda_runtime.CUDARuntime(kernel.target.arch)
    rt.tensor_device = "cpu"
    k._runtime = rt
    prog = cuda_runtime.CUDAProgram(kernel.binary, kernel.source)
    prog.tensor_flag = "is_cpu"
    prog._cuLaunchKernel = launch_fn
    prog.lib = types.SimpleNamespace(cuGetErrorString=lambda code, out: 0)
    prog._get_device = sys.getrecursionlimit  # a C builtin of no arguments returning an int, as torch's is
    prog._get_stream = abs                    # a C builtin of one argument returning an int
    dev = prog._get_device()
    prog.funcs[dev] = (None, ctypes.c_void_p(0xF00D))
    status = torch.zeros(cuda_runtime.STATUS_WORDS, dtype=torch.int32)
    prog._status_by_dev[dev] = (status, status.data_ptr())
    prog._enter(dev)
    k._program = prog
    old = os.environ.get("TILECORE_C_LAUNCHER")
    os.environ["TILECORE_C_LAUNCHER"] = mode
    try:
        x = torch.randn(4096)
        k(x, torch.randn(4096), torch.empty(4096)) if kernel.meta["signature"]["params"].__len__() == 3 else k(x)
    finally:
        if old is None:
            os.environ.pop("TILECORE_C_LAUNCHER")
        else:
            os.environ["TILECORE_C_LAUNCHER"] = old
    return k


def one_tensor_kernel():
    import tilecore.language as T

    @T.prim_func
    def fill(A: T.Tensor((4096,), "float32")):
        with T.Kernel(16, threads=256) as bx:
            for i in T.Parallel(256):
                A[bx * 256 + i] = 1.0

    return fill


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=40000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import torch

    import tilecore
    from cuda_gemm import vadd

    lib, launch_fn = noop_launch()
    add = tilecore.compile(vadd(4096), target="cuda:sm_90a")
    fill = tilecore.compile(one_tensor_kernel(), target="cuda:sm_90a")
    x, y, z = (torch.randn(4096) for _ in range(3))
    a3 = (x, y, z)
    calls, repeat = args.calls, args.repeat
    empty = per_call_ns(lambda: None, calls, repeat)
    rows = []

    def row(what, fn, note=""):
        ns = per_call_ns(fn, calls, repeat) - empty
        rows.append((what, ns, note))
        return ns

    kernels = {mode: cpu_kernel(add, mode, launch_fn) for mode in ("0", "getters", "1")}
    if kernels["getters"]._native is None:
        from tilecore.runtime import clauncher

        print(f"no compiled launcher here: {clauncher.why_unavailable()}", file=sys.stderr)
        return 1
    py = row("kernel(x, y, z), Python binder (TILECORE_C_LAUNCHER=0, D19)", lambda: kernels["0"](x, y, z))
    d23 = row("kernel(x, y, z), compiled launcher, torch's getters (TILECORE_C_LAUNCHER=getters, D23)",
                lambda: kernels["getters"](x, y, z))
    shim = kernels["1"]._native.reads == "shim"
    direct = row(f"kernel(x, y, z), compiled launcher, tensors through torch's {'C shim' if shim else 'getters'} (D57, "
                 "default)", lambda: kernels["1"](x, y, z))
    g3 = kernels["getters"]._native
    row("  the launcher alone, 3 tensors, torch's getters", lambda: g3(a3))
    native = kernels["1"]._native
    row("  the launcher alone, 3 tensors, torch's C shim", lambda: native(a3))
    n1, a1 = cpu_kernel(fill, "getters", launch_fn)._native, (x,)
    row("  the launcher alone, 1 tensor, torch's getters", lambda: n1(a1))
    s1 = cpu_kernel(fill, "1", launch_fn)._native
    row("  the launcher alone, 1 tensor, torch's C shim", lambda: s1(a1))
    for what, fn in (("dtype", lambda: x.dtype), ("shape", lambda: x.shape), ("is_cpu", lambda: x.is_cpu),
                     ("is_contiguous()", lambda: x.is_contiguous()), ("data_ptr()", lambda: x.data_ptr())):
        row(f"  torch getter alone through Python: {what}", fn)
    print(f"thread CPU time per call, best of {repeat} x {calls}, less an empty loop's {empty:.0f} ns; "
          f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    print("| per call | ns | vs Python binder | vs D23 |")
    print("|---|---|---|---|")
    for what, ns, _ in rows:
        print(f"| {what} | {ns:.0f} | {py / ns:.2f}x | {d23 / ns:.2f}x |")
    print(f"D57 saves {d23 - direct:.0f} ns per call against D23's ({d23:.0f} -> {direct:.0f})")
    del lib
    return 0


if __name__ == "__main__":
    sys.exit(main())
