"""The TileLang corpus kernels whose fragments left shared memory with D88 (the uniform layout of small fragments that
block-level statements access; a nest writing a fragment without its extent-1 loop variables), on a CUDA GPU: each
kernel with ``tilecore.uniform_fragments`` on (the default) and off (those fragments in shared memory, as before) and
the torch equivalent, one process, interleaved in a shuffled order.

    python benchmarks/uniform_fragments.py [--rep 20] [--shuffle SEED] [--only NAME,...]

Kernels (kernel code as TileLang wrote it, tests/tilelang_corpus/): ``softmax_online`` (8192 x 8192, against
torch.softmax), ``softmax_online_eager`` (the same sizes, BLOCK_N 8192), ``norm_layernorm_bwd`` (4096 x 8192 bf16,
against ATen's native_layer_norm_backward), ``gemm_streamk`` (the example's schedule for 4096 x 4096 x 4096 fp16 on
132 SMs, against torch.matmul). Prints milliseconds, on / off and torch / on, registers and spills, the largest error
of each build against a float64 (float32 for the GEMM) reference. Exits with status 3 where no CUDA GPU is present.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cuda_gemm import event_ms, has_gpu  # noqa: E402

OFF = {"tilecore.uniform_fragments": False}


def _compile(func, target, configs, out_idx=None):
    return tilecore.compile(func, target=target, out_idx=out_idx,
                            pass_configs={"tilecore.disable_cache": True, **configs})


def _streamk_module(m, n, k, total_sm, bm, bn, bk):
    """The example's module-level schedule (its kernel reads these globals) recomputed for another problem."""
    import tilelang_corpus.gemm_streamk as mod

    mod.m, mod.n, mod.k, mod.total_sm = m, n, k, total_sm
    mod.BLOCK_SIZE_M, mod.BLOCK_SIZE_N, mod.BLOCK_SIZE_K = bm, bn, bk
    mod.streamk_programs = total_sm
    mod.num_block_m, mod.num_block_n = -(-m // bm), -(-n // bn)
    mod.iters_per_tile = -(-k // bk)
    mod.total_tiles = mod.num_block_m * mod.num_block_n
    mod.streamk_tiles = mod.total_tiles % total_sm
    if mod.total_tiles - mod.streamk_tiles > total_sm:
        mod.streamk_tiles += total_sm
    mod.blocking_tiles = mod.total_tiles - mod.streamk_tiles
    mod.streamk_iters = mod.streamk_tiles * mod.iters_per_tile
    mod.streamk_full_tiles = mod.streamk_iters // total_sm
    mod.streamk_partial_tiles = mod.streamk_iters % total_sm
    mod.sm_patition_factor = max(mod.blocking_tiles // total_sm, 1)
    args = (m, n, k, mod.streamk_tiles, bm, bn, bk, False, True, "float16", "float16", "float32", 2, 128)
    return mod, args


def cases(target, only):
    """name -> (builds {"on": kernel, "off": kernel}, make inputs, run a build, torch, error of an output)."""
    import torch
    import torch.nn.functional as F

    out = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    if not only or "softmax_online" in only:
        from tilelang_corpus.softmax_online import softmax_kernel

        M = N = 8192
        func = softmax_kernel.get_tir(M, N)
        X = torch.randn(M, N, device="cuda", dtype=torch.float16, generator=g)
        ref = X.double().softmax(1)
        out["softmax_online"] = ({c: _compile(func, target, cfg, [1]) for c, cfg in (("on", {}), ("off", OFF))},
                                 lambda k, X=X: k(X), lambda X=X: torch.softmax(X, 1),
                                 lambda y, ref=ref: (y.double() - ref).abs().max().item())
    if not only or "softmax_online_eager" in only:
        import tilelang_corpus.softmax_online_eager as mod

        mod.M, mod.N = 8192, 8192
        fn = getattr(mod.softmax_kernel, "jit_fn", mod.softmax_kernel)
        func = fn.get_tir(BLOCK_N=8192)
        X = torch.randn(8192, 8192, device="cuda", dtype=torch.float16, generator=g)
        Y = torch.empty_like(X)
        ref = X.double().softmax(1)

        def run(k, X=X, Y=Y):  # compiled from its prim_func: Y is an argument
            k(X, Y)
            return Y

        out["softmax_online_eager"] = ({c: _compile(func, target, cfg) for c, cfg in (("on", {}), ("off", OFF))},
                                       run, lambda X=X: torch.softmax(X, 1),
                                       lambda y, ref=ref: (y.double() - ref).abs().max().item())
    if not only or "norm_layernorm_bwd" in only:
        from tilelang_corpus.norm_layernorm_bwd import _layernorm_bwd

        N, D, eps = 4096, 8192, 1e-5
        func = _layernorm_bwd.get_tir(N, D)
        x, dy = (torch.randn(N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        gam = torch.randn(D, device="cuda", dtype=torch.bfloat16, generator=g)
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + eps)
        dg, db = torch.zeros(D, device="cuda"), torch.zeros(D, device="cuda")
        ref = torch.ops.aten.native_layer_norm_backward(dy.double(), x.double(), (D,), mean.double()[:, None],
                                                        rstd.double()[:, None], gam.double(), None,
                                                        [True, False, False])[0]

        def run(k, dg=dg, db=db):
            return k(dy, x, gam, mean, rstd, dg, db)

        out["norm_layernorm_bwd"] = (
            {c: _compile(func, target, cfg, [-3]) for c, cfg in (("on", {}), ("off", OFF))}, run,
            lambda: torch.ops.aten.native_layer_norm_backward(dy, x, (D,), mean[:, None], rstd[:, None], gam, None,
                                                              [True, True, False]),
            lambda y, ref=ref: (y.double() - ref).abs().max().item())
    if not only or "gemm_streamk" in only:
        m = n = k = 4096
        mod, args = _streamk_module(m, n, k, 132, 128, 128, 32)
        func = mod.tl_matmul_streamk.get_tir(*args)
        A = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
        B = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=g)
        C = torch.zeros(m, n, device="cuda", dtype=torch.float16)
        ref = A.float() @ B.float().T

        def run(kern, A=A, B=B, C=C):
            C.zero_()
            kern(A, B, C)
            return C

        out["gemm_streamk"] = ({c: _compile(func, target, cfg) for c, cfg in (("on", {}), ("off", OFF))}, run,
                               lambda: torch.matmul(A, B.T), lambda y, ref=ref: (y.float() - ref).abs().max().item())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--shuffle", type=int, default=0, help="seed of the order the builds are timed in")
    ap.add_argument("--only", default="", help="comma-separated kernel names")
    ap.add_argument("--profile", action="store_true",
                    help="run each build of each kernel once (on, then off; no torch, no timing): for ncu -k tc_kernel")
    args = ap.parse_args()
    ok, why = has_gpu()
    if not ok:
        print(f"uniform_fragments: {why}; nothing timed", file=sys.stderr)
        return 3
    import torch

    only = [x for x in args.only.split(",") if x]
    cc = torch.cuda.get_device_capability()
    target = f"cuda:sm_{cc[0]}{cc[1]}" + ("a" if cc == (9, 0) else "")
    table = cases(target, only)
    if args.profile:
        for name, (builds, run, _ref, error) in table.items():
            for b in ("on", "off"):
                print(name, b, f"max err {error(run(builds[b])):.2e}")
        torch.cuda.synchronize()
        return 0
    slots = [(name, b) for name in table for b in ("on", "off", "torch")]
    random.Random(args.shuffle).shuffle(slots)
    ms, err = {}, {}
    for name, b in slots:
        builds, run, ref_fn, error = table[name]
        try:
            if b == "torch":
                ms[name, b] = event_ms(ref_fn, args.rep)
                continue
            kern = builds[b]
            err[name, b] = error(run(kern))
            ms[name, b] = event_ms(lambda: run(kern), args.rep)
        except Exception as e:  # noqa: BLE001 - one row's failure is printed, the others still run
            print(f"{name} {b}: {type(e).__name__}: {e}", file=sys.stderr)
            ms[name, b], err[name, b] = float("nan"), float("nan")
    print(f"{torch.cuda.get_device_name()} ({target}), order seed {args.shuffle}")
    print("| kernel | on ms | off ms | torch ms | off / on | torch / on | registers on / off | spills on / off | "
          "max err on / off |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (builds, *_r) in table.items():
        p = {b: builds[b].meta["source"]["meta"].get("ptxas", {}) for b in builds}
        on, off, tt = ms[name, "on"], ms[name, "off"], ms[name, "torch"]
        print(f"| {name} | {on:.4f} | {off:.4f} | {tt:.4f} | {off / on:.2f}x | {tt / on:.2f}x | "
              f"{p['on'].get('registers', '?')} / {p['off'].get('registers', '?')} | "
              f"{p['on'].get('spill_stores', '?')} / {p['off'].get('spill_stores', '?')} | "
              f"{err[name, 'on']:.2e} / {err[name, 'off']:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
