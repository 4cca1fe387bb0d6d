"""The kernels benchmarks/gemm_burst.py and benchmarks/gemm_power.py put side by side (D76, shared since D80): the
pass-config variants their ``--variants`` name, and for one square size and dtype the operands and the row list
(cuBLAS, each tilecore block under each variant, checked against cuBLAS's result, Triton).
"""
from __future__ import annotations

import json

from cuda_gemm import matmul


def parse_variants(spec: str, error) -> list:
    """``[(name, pass configs)]`` of ``spec``: ';'-separated ``NAME=JSON`` entries or names of
    benchmarks/general_gemm.py's variants (the general path under their configs); ``error(message)`` on a bad one
    (argparse's ``ap.error``: it exits)."""
    from general_gemm import GENERAL, VARIANTS

    out = []
    for v in (v.strip() for v in spec.split(";") if v.strip()):
        if "=" not in v:
            if v not in VARIANTS:
                error(f"--variants: {v!r} is neither NAME=JSON nor one of general_gemm.py's ({', '.join(VARIANTS)})")
            out.append((v, {**GENERAL, **VARIANTS[v]}))
            continue
        try:
            out.append((v.split("=", 1)[0].strip(), json.loads(v.split("=", 1)[1])))
        except ValueError as e:
            error(f"--variants: {v!r} is not NAME=JSON ({e})")
    return out


def label(bm, bn, bk, stages, panel, name: str = "") -> str:
    """A tilecore row's label: ``tilecore 128x256x64/3`` (`` p16`` where the panel is not 8) and the variant's name."""
    return f"tilecore {bm}x{bn}x{bk}/{stages}" + (f" p{panel}" if panel != 8 else "") + (f" {name}" if name else "")


def square_rows(size: int, dtype: str, configs: str, variants: list, triton=None, say=print) -> tuple:
    """``(flop, [(label, fn, match)])`` for ``size``^3 in ``dtype``: cuBLAS (``torch.matmul`` into C), then for each
    tilecore block of ``configs`` (``bm:bn:bk:threads:stages:panel``, comma-separated) each ``(name, pass configs)``
    of ``variants`` (name "" for no suffix), left out with a line through ``say`` where its result is more than 5%
    of the largest element away from cuBLAS's; Triton's where given. ``match(kernel name)``: whether a CUDA kernel a
    profiler saw is the row's (cuBLAS and Triton: any kernel of their call; tilecore: ``tc_kernel``). Operands:
    ``randn / 4``."""
    import torch

    import tilecore

    tdt = getattr(torch, dtype)
    a = torch.randn(size, size, device="cuda", dtype=tdt) / 4
    b = torch.randn(size, size, device="cuda", dtype=tdt) / 4
    c = torch.empty(size, size, device="cuda", dtype=tdt)
    ref = torch.matmul(a, b).float()
    rows = [("cuBLAS", lambda: torch.matmul(a, b, out=c), lambda n: True)]
    for cfg in (x for x in configs.split(",") if x):
        bm, bn, bk, threads, stages, panel = (int(x) for x in cfg.split(":"))
        for name, pc in variants:
            k = tilecore.compile(matmul(size, size, size, bm, bn, bk, threads, stages, panel, dtype), target="cuda",
                                 pass_configs=pc)
            k(a, b, c)
            torch.cuda.synchronize()
            err = float((c.float() - ref).abs().max())
            if err > 0.05 * float(ref.abs().max()):
                say(f"({label(bm, bn, bk, stages, panel, name)}: wrong numbers (max error {err:.3g}), left out)")
                continue
            rows.append((label(bm, bn, bk, stages, panel, name), lambda k=k: k(a, b, c), lambda n: "tc_kernel" in n))
    if triton is not None:
        rows.append(("Triton", lambda: triton(a, b, c), lambda n: True))
    return 2.0 * size ** 3, rows
