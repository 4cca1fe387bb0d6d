"""TileLang's own norm examples (tests/tilelang_corpus: layernorm forward, RMSNorm, both at blk_m = 1, kernel code as
TileLang wrote it) on a CUDA GPU against torch, same run; ``--load DIR`` times kernels another tree compiled
(``--export DIR``) beside this tree's.

    python benchmarks/corpus_norms.py [--rows 4096 --cols 8192] [--rep 20] [--export DIR | --load DIR]

At blk_m = 1 a block holds one row; before the core's blocked layout gave the threads the rows leave idle more
columns (2026-11-26), the row sat on one warp's lanes with copies on the other warps (layernorm: 256 registers a
thread, 1.3 KB spilled on sm_90a). Before D42 the layernorm's three copies (X, gamma, beta) were three waits and
three barriers, each moving 2-byte elements (a one-row copy failed the CUDA helper's alignment test); now one
asynchronous group of 16-byte copies. Prints GB/s (the row data read and written once) and the ratio to torch.
Exits with status 3 where no CUDA GPU is present (after --export, which needs none).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cuda_gemm import event_ms, has_gpu  # noqa: E402


def kernels(rows, cols, target):
    from tilelang_corpus.norm_layernorm_fwd import _layernorm_fwd
    from tilelang_corpus.norm_rms import rms_norm

    return {"layernorm_fwd": tilecore.compile(_layernorm_fwd.get_tir(rows, cols), target=target, out_idx=[-3, -2, -1],
                                              pass_configs={"tilecore.disable_cache": True}),
            "rms_norm": tilecore.compile(rms_norm.get_tir(rows, cols, 1), target=target, out_idx=[-1],
                                         pass_configs={"tilecore.disable_cache": True})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--export", metavar="DIR", help="write this tree's kernels here (no GPU needed)")
    ap.add_argument("--load", metavar="DIR", help="also time the kernels --export wrote there (another tree's)")
    args = ap.parse_args()
    ok, why = has_gpu()
    r, c = args.rows, args.cols
    ours = kernels(r, c, "cuda" if ok else "cuda:sm_90a")
    if args.export:
        Path(args.export).mkdir(parents=True, exist_ok=True)
        for name, k in ours.items():
            print("exported", k.export(Path(args.export) / f"{name}.tck"))
    if not ok:
        print(f"corpus_norms: {why}; nothing timed", file=sys.stderr)
        return 3
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(0)
    x16 = torch.randn(r, c, device="cuda", dtype=torch.bfloat16, generator=g)
    gamma, beta = (torch.randn(c, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    x32 = torch.randn(r, c, device="cuda", dtype=torch.float32, generator=g)
    cases = {"layernorm_fwd": ((x16, gamma, beta), lambda: F.layer_norm(x16, (c,), gamma, beta, 1e-5),
                               2 * r * c * 2, lambda out: (out[0].float() - F.layer_norm(x16.float(), (c,), gamma.float(),
                                                                                          beta.float(), 1e-5)).abs().max()),
             "rms_norm": ((x32,), lambda: F.rms_norm(x32, (c,), eps=1e-12), 2 * r * c * 4,
                          lambda out: (out - F.rms_norm(x32.double(), (c,), eps=1e-12).float()).abs().max())}
    print(f"| kernel ({r}x{c}) | build | GB/s | torch GB/s | ours / torch | registers | spilled bytes | max err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (inputs, ref, nbytes, err) in cases.items():
        torch_ms = event_ms(ref, args.rep)
        builds = {"this tree": ours[name]}
        if args.load and (Path(args.load) / f"{name}.tck").exists():
            builds["loaded"] = tilecore.load_kernel(Path(args.load) / f"{name}.tck")
        for build, k in builds.items():
            out = k(*inputs)
            e = float(err(out))
            ms = event_ms(lambda: k(*inputs), args.rep)
            p = k.meta["source"]["meta"].get("ptxas", {})
            print(f"| {name} | {build} | {nbytes / ms / 1e6:.0f} | {nbytes / torch_ms / 1e6:.0f} | {torch_ms / ms:.2f}x | "
                  f"{p.get('registers', '?')} | {p.get('spill_stores', '?')} | {e:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
