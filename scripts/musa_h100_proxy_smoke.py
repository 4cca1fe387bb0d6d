"""H100 PROXY SMOKE for tilecore-musa (not a MUSA run, never `device` mode).

Builds the warp-32 SIMT subset of the MUSA code tilecore-musa generates for ``musa:mp_31`` (kernels with no
TME, ASYNC barrier, SQMMA or async-copy statements: softmax, RMSNorm, LayerNorm, copies) with nvcc through
a musa -> cuda mapping header (backends/musa/tests/musa2cuda: ``__mt_bfloat16`` is ``__nv_bfloat16``; the
CUDA-style built-ins are CUDA's), launches it on an NVIDIA GPU through tilecore-cuda's driver runtime and
compares with the conformance suite's float64 references. It shows that the MUSA spelling of the core's
SIMT code is right at a warp width of 32; it cannot say anything about QY2 (128-wide warps: the same code
run at width 32 is silently wrong, so those kernels are refused here), TME, SQMMA or the vendor intrinsics.

    python scripts/musa_h100_proxy_smoke.py            # on the H100 test machine: build, run, compare
    python scripts/musa_h100_proxy_smoke.py --build    # anywhere with nvcc: build only

Prints one line per kernel, ``PROXY-SMOKE <kernel>: PASS|FAIL (max error ...)``; exit status 1 on a FAIL.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import tilecore
from tilecore.plugin import Source
from tilecore_conformance import composite

ROOT = Path(__file__).resolve().parents[1]
MAPPING = ROOT / "backends" / "musa" / "tests" / "musa2cuda"
CASES = [("softmax/float32", composite.softmax, composite.softmax_ref, composite.row_inputs, ("float32",)),
         ("softmax/float16", composite.softmax, composite.softmax_ref, composite.row_inputs, ("float16",)),
         ("rmsnorm/float32", composite.rmsnorm, composite.rmsnorm_ref, composite.row_inputs, ("float32",)),
         ("layernorm/float32", composite.layernorm, composite.layernorm_ref, composite.row_inputs, ("float32",))]


def build(code: str, arch: str = "sm_90") -> bytes:
    with tempfile.TemporaryDirectory(prefix="musa-proxy-") as tmp:
        src, out = Path(tmp, "kernel.cu"), Path(tmp, "kernel.cubin")
        src.write_text(code)
        proc = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-std=c++17", "-O3", "-diag-suppress=177",
                               f"-I{MAPPING}", str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"nvcc rejected the MUSA source through musa2cuda:\n{proc.stderr[-3000:]}")
        return out.read_bytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="build with nvcc only (no GPU needed)")
    ap.add_argument("--target", default="musa:mp_31")
    args = ap.parse_args()
    kernel0 = tilecore.compile(composite.softmax("float32"), target=args.target)
    warp = kernel0.source.meta["warp"]
    if warp != 32:
        print(f"PROXY-SMOKE refused: {args.target} has {warp}-wide warps; an NVIDIA warp is 32 wide, so this proxy "
              "would run the code at the wrong width (silently wrong)")
        return 2
    failed = False
    for name, make, ref, inputs, params in CASES:
        k = tilecore.compile(make(*params), target=args.target)
        vendor = k.source.meta["vendor"]
        if any(vendor[key] for key in ("tme_loads", "sqmma_gemms", "async_copies")) or vendor["async_barriers"]:
            print(f"PROXY-SMOKE {name}: skipped (uses MUSA vendor statements: {vendor})")
            continue
        binary = build(k.source.code)
        if args.build:
            print(f"PROXY-SMOKE {name}: built ({len(binary)} bytes of cubin)")
            continue
        import torch
        from tilecore_cuda.runtime import CUDAProgram

        prog = CUDAProgram(binary, Source(k.source.code, "cuda", k.source.entry, dict(k.source.meta)))
        rng = np.random.default_rng(0)
        host = inputs(rng, *params)
        want = ref(host, *params)[0]
        dev = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in host]
        out = torch.empty(want.shape, dtype=dev[0].dtype, device="cuda")
        prog.launch([t.data_ptr() for t in dev + [out]], [], [])
        torch.cuda.synchronize()
        err = float(np.abs(out.float().cpu().numpy().astype(np.float64) - want).max())
        tol = 1e-5 if params[0] == "float32" else 2e-3
        ok = err <= tol * max(1.0, float(np.abs(want).max()))
        failed |= not ok
        print(f"PROXY-SMOKE {name}: {'PASS' if ok else 'FAIL'} (max error {err:.3g}; MUSA code via musa2cuda + nvcc on "
              f"{torch.cuda.get_device_name()}, not a MUSA device)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
