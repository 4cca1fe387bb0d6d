"""The core's general path on the Hopper GEMM schedule (docs/decisions.md D46): one process, one table.

For each shape and dtype, beside cuBLAS (torch.matmul) and the CUDA plugin's Hopper pipeline (the default build of
the README GEMM), the general path (``tilecore.cuda.register_programs=False``) with each combination of
``tilecore.persistent``, ``tilecore.warp_specialize`` and ``tilecore.bulk_store`` asked for. Every variant's
result is compared bit for bit with the plain general path's (``same`` column) and against torch's.

    python benchmarks/general_gemm.py --sizes 4096,8192 --rep 20
    python benchmarks/general_gemm.py --variants plain,persistent,ws+persistent,ws+persistent+bulk --configs 128:256:64:256:3
    python benchmarks/general_gemm.py --dtypes float8_e4m3 --variants plain,default,d58 --configs 128:256:128:256:3:8

8-bit dtypes (D67): B given as (N, K), C in float16, cuBLAS through torch._scaled_mm (unit scales).

Prints TFLOP/s and the ratio to cuBLAS; never asserts timings.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cuda_gemm import event_ms, has_gpu, matmul, triton_matmul  # noqa: E402

GENERAL = {"tilecore.cuda.register_programs": False}
#: the plugin's Hopper pipeline, whatever the default routing of plain GEMMs (D58)
PLUGIN = {"tilecore.cuda.general_plain_gemm": False}
#: D59's CUDA options asked for on the GEMM (D62): the descriptors' warpgroup term warp-uniform, stage slots and
#: parities as masks and shifts
US = {"tilecore.cuda.uniform_warp_index": True, "tilecore.cuda.nonnegative_index_shifts": True}
#: name -> pass configs on top of GENERAL
VARIANTS = {
    "plain": {"tilecore.bulk_store": False},
    "persistent": {"tilecore.persistent": True, "tilecore.bulk_store": False},
    "ws": {"tilecore.warp_specialize": True, "tilecore.bulk_store": False},
    "bulk": {"tilecore.bulk_store": True, "tilecore.persistent": False},
    "default": {},  # D51: the bulk store where it applies, stmatrix into its tile; D56: the persistent loop with a panel
    "default-no-persistent": {"tilecore.persistent": False},  # D51's default
    "default-per-tile": {"tilecore.persistent_next_indices": "per_tile"},  # D56's next tile's indices bound per tile
    "default-stsm-off": {"tilecore.matrix_stores": False},  # the same with the tile's pair stores (D46's epilogue)
    # D58: the tile in parts where the whole does not fit beside the stages (the default); never in parts (the
    # before: the direct stores there); always in 2 parts
    "default-parts-off": {"tilecore.bulk_store_parts": 1},
    "default-parts-2": {"tilecore.bulk_store_parts": 2},
    "default-per-step": {"tilecore.persistent_next_indices": "per_step"},
    # the plugin's passes on, the plain (non-split-K) GEMM routed to the general path (D51; the same source as default)
    "routed": {"tilecore.cuda.register_programs": True, "tilecore.cuda.general_plain_gemm": True},
    "ws+persistent": {"tilecore.warp_specialize": True, "tilecore.persistent": True, "tilecore.bulk_store": False},
    "persistent+bulk": {"tilecore.persistent": True, "tilecore.bulk_store": True},
    "ws+persistent+bulk": {"tilecore.warp_specialize": True, "tilecore.persistent": True, "tilecore.bulk_store": True},
    # D56's controls: the persistent walk of a T.use_swizzle panel with D36's run-time rows (a run-time divisor in
    # every k step's stage-ahead indices), and the warp-specialized tile's last stage released by the next tile
    "persistent+bulk-per-tile": {"tilecore.persistent": True, "tilecore.bulk_store": True,
                                 "tilecore.persistent_next_indices": "per_tile"},
    "persistent+bulk-runtime-rows": {"tilecore.persistent": True, "tilecore.bulk_store": True,
                                     "tilecore.persistent_panel_rows": "runtime"},
    # D56's candidate default: the plain GEMM routed to the general path, the persistent loop where the bulk store is
    "routed-persistent-auto": {"tilecore.cuda.register_programs": True, "tilecore.cuda.general_plain_gemm": True,
                               "tilecore.persistent": "auto"},
    # D58: the consumer warpgroups of ws + persistent + bulk taking turns issuing their gemms (D55's ping-pong)
    "ws+persistent+bulk+pingpong": {"tilecore.warp_specialize": True, "tilecore.persistent": True,
                                    "tilecore.bulk_store": True, "tilecore.pingpong": True},
    "ws+persistent+bulk-d46-release": {"tilecore.warp_specialize": True, "tilecore.persistent": True,
                                       "tilecore.bulk_store": True, "tilecore.release_last_stage": False},
    # D62: the 128x128 k step's bookkeeping. D59's uniform warp index (descriptors in the uniform datapath) and
    # nonnegative index shifts (stage slots / parities as masks and shifts) on the GEMM ("us"); no block barrier in
    # the loop, each stage released on its own barrier, thread 0 waiting for the release before the refill
    # ("release"); D59's descriptor offsets ("doff"); the warp-specialized form (the plugin's shape) with "us"
    "default-us": {**US},  # (D62's default for persistent GEMMs: the same source as "default")
    "d58": {"tilecore.cuda.uniform_warp_index": False, "tilecore.cuda.nonnegative_index_shifts": False},  # the before
    "default-release": {"tilecore.pipeline_release_stages": True, "tilecore.cuda.uniform_warp_index": False,
                        "tilecore.cuda.nonnegative_index_shifts": False},
    "default-us-release": {**US, "tilecore.pipeline_release_stages": True},
    "default-us-doff": {**US, "tilecore.cuda.descriptor_offsets": True},
    "default-us-release-doff": {**US, "tilecore.pipeline_release_stages": True, "tilecore.cuda.descriptor_offsets": True},
    # the stage ahead issued by thread 224 (the last warp's first lane: off the first warpgroup's path)
    "default-us-t224": {**US, "tilecore.pipeline_issue_thread": 224},
    "default-us-release-t224": {**US, "tilecore.pipeline_release_stages": True, "tilecore.pipeline_issue_thread": 224},
    "ws-us": {**US, "tilecore.warp_specialize": True, "tilecore.persistent": True, "tilecore.bulk_store": True},
    # the routed default (the plain GEMM on the general path through the plugin's passes, D58's genpath2-route)
    "routed-default": {"tilecore.cuda.register_programs": True, "tilecore.cuda.general_plain_gemm": True},
    # D67: the routing's "auto" rule (16- and 8-bit GEMMs asking for none of the pipeline's own options)
    "routed-auto": {"tilecore.cuda.register_programs": True, "tilecore.cuda.general_plain_gemm": "auto"},
    # D76: the default route launched as a programmatic dependent launch (griddepcontrol at the kernel's top,
    # cuLaunchKernelEx with the programmatic stream serialization attribute)
    "routed-pdl": {"tilecore.cuda.register_programs": True, "tilecore.cuda.general_plain_gemm": "auto",
                   "tilecore.cuda.programmatic_launch": True},
    "ws-us-doff": {**US, "tilecore.warp_specialize": True, "tilecore.persistent": True, "tilecore.bulk_store": True,
                   "tilecore.cuda.descriptor_offsets": True},
    # D80: the warp-specialized form in block groups of two (thread-block clusters 2x1): the operand the pair's tiles
    # share (B at 128x256 tiles in T.use_swizzle panels) loaded half by each block and multicast to both
    "ws-mc": {**US, "tilecore.warp_specialize": True, "tilecore.persistent": True, "tilecore.bulk_store": True,
              "tilecore.cuda.descriptor_offsets": True, "tilecore.group_multicast": 2},
    # D65 undone (the before): each matrix store's lane address as pair 0's coordinates at another thread plus a
    # select, its whole swizzled offset computed at every store
    "d65-off": {"tilecore.matrix_store_lanes": "general", "tilecore.cuda.matrix_store_offsets": False},
    "routed-d65-off": {"tilecore.cuda.register_programs": True, "tilecore.cuda.general_plain_gemm": True,
                       "tilecore.matrix_store_lanes": "general", "tilecore.cuda.matrix_store_offsets": False},
}


class _Skip(Exception):
    """--no-plugin: the plugin's row left out."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,8192", help="square sizes M=N=K")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each tile's kernels in turn this many rounds and report each one's median (D62)")
    ap.add_argument("--configs", default="128:256:64:256:3:8,128:256:64:256:3,128:128:64:256:4",
                    help="block_M:block_N:block_K:threads:stages[:panel],... (panel: T.use_swizzle(panel))")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--triton", action="store_true", help="add cuda_gemm.py's plain Triton GEMM (16-bit only)")
    ap.add_argument("--no-plugin", dest="plugin", action="store_false",
                    help="leave out the CUDA plugin's Hopper pipeline (its row and its compile)")
    ap.add_argument("--census", action="store_true",
                    help="no GPU: which catalog GEMMs on cuda:sm_90a the Hopper pipeline takes, and what the general "
                         "path makes of them (tilecore.cuda.general_plain_gemm)")
    args = ap.parse_args()
    if args.census:
        return census()
    ok, why = has_gpu()
    if not ok:
        print(f"no GPU: {why}")
        return 0
    import torch

    import tilecore

    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}")
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c]
    print(f"device: {torch.cuda.get_device_name()}")
    triton = triton_matmul() if args.triton else None
    if args.triton and triton is None:
        print("(Triton is not installed: its rows are left out)")
    print("| dtype | shape | kernel | tile | ms | TFLOP/s | / cuBLAS | same bits as plain | max err vs torch | notes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        # 8-bit operands (D67): B given as (N, K) (wgmma reads 8-bit operands K-major only), C in float16, cuBLAS's
        # fp8 GEMM through torch._scaled_mm with unit scales (the issue table's fp8 row)
        eight = dtype.startswith("float8")
        tdt = {"float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}[dtype] if eight else getattr(torch, dtype)
        odt = torch.float16 if eight else tdt
        for size in (int(s) for s in args.sizes.split(",")):
            M = N = K = size
            flops = 2 * M * N * K
            g = torch.Generator(device="cuda").manual_seed(0)
            a = (torch.randn(M, K, device="cuda", generator=g) / 8).to(tdt)
            if eight:
                b = (torch.randn(N, K, device="cuda", generator=g) / 8).to(tdt)
                one = torch.ones((), device="cuda")
                ref = a.float() @ b.float().t()
                blas = lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=odt)  # noqa: E731
                blas_name = "cuBLAS (torch._scaled_mm)"
            else:
                b = (torch.randn(K, N, device="cuda", generator=g) / 8).to(tdt)
                ref = torch.matmul(a, b)
                blas = lambda: torch.matmul(a, b)  # noqa: E731
                blas_name = "cuBLAS (torch.matmul)"
            try:
                ms_cublas = event_ms(blas, args.rep)
            except Exception as e:  # noqa: BLE001 (cuBLAS has no e5m2 x e5m2 GEMM)
                print(f"| {dtype} | {size}^3 | {blas_name} | - | failed: {type(e).__name__}: {str(e)[:100]} |")
                ms_cublas = float("nan")

            def row(kernel, tile, ms, same, err, notes=""):
                tf = flops / ms / 1e9
                print(f"| {dtype} | {size}^3 | {kernel} | {tile} | {ms:.4f} | {tf:.1f} | {ms_cublas / ms:.3f}x | "
                      f"{same} | {err} | {notes} |", flush=True)

            if ms_cublas == ms_cublas:
                row(blas_name, "-", ms_cublas, "-", "-")
            for cfg in configs:
                bm, bn, bk, threads, stages = cfg[:5]
                panel = cfg[5] if len(cfg) > 5 else 0
                tile = f"{bm}x{bn}x{bk} {threads}t {stages}s" + (f" panel {panel}" if panel else "")
                kw = {"out_dtype": "float16", "b_transposed": True} if eight else {}
                fn = lambda: matmul(M, N, K, bm, bn, bk, threads, stages, panel, dtype=dtype, **kw)  # noqa: E731
                timed = []  # (kernel, its call, same, err, notes), timed after the tile's kernels are built
                if args.rounds > 1 and ms_cublas == ms_cublas:
                    # D76: the reference timed in the same rounds as the tile's kernels (its row: the median), the
                    # ratios against that median
                    timed.append((blas_name + " (in the rounds)", blas, "-", "-", ""))
                if triton is not None and not eight:
                    c_tr = torch.empty(M, N, device="cuda", dtype=odt)
                    triton(a, b, c_tr)
                    timed.append(("Triton", (lambda o=c_tr: triton(a, b, o)), "-",
                                  f"{float((c_tr.float() - ref.float()).abs().max()):.3g}", ""))
                try:
                    if not args.plugin:
                        raise _Skip

                    hop = tilecore.compile(fn(), target="cuda", pass_configs=PLUGIN)
                    c_hop = torch.empty(M, N, device="cuda", dtype=odt)
                    hop(a, b, c_hop)
                    torch.cuda.synchronize()
                    timed.append(("Hopper pipeline (plugin)", (lambda h=hop, o=c_hop: h(a, b, o)), "-",
                                  f"{float((c_hop.float() - ref.float()).abs().max()):.3g}", ""))
                except _Skip:
                    pass
                except Exception as e:  # noqa: BLE001
                    print(f"| {dtype} | {size}^3 | Hopper pipeline | {tile} | failed: {type(e).__name__}: {e} |")
                plain = None
                for v in variants:
                    try:
                        k = tilecore.compile(fn(), target="cuda", pass_configs={**GENERAL, **VARIANTS[v]})
                    except Exception as e:  # noqa: BLE001
                        print(f"| {dtype} | {size}^3 | general {v} | {tile} | compile failed: {type(e).__name__}: {e} |")
                        continue
                    c = torch.full((M, N), float("nan"), device="cuda", dtype=odt)
                    k(a, b, c)
                    torch.cuda.synchronize()
                    if v == "plain":
                        plain = c.clone()
                    same = "-" if plain is None or v == "plain" else ("yes" if torch.equal(plain, c) else "NO")
                    err = f"{float((c.float() - ref.float()).abs().max()):.3g}"
                    attrs = k.meta.get("attrs", {})
                    notes = []
                    pipes = " ".join(attrs.get("pipelines", ()))
                    if "warp-specialized" in pipes:
                        notes.append("ws")
                    elif "not warp-specialized" in pipes:
                        notes.append("ws refused: " + pipes.split("not warp-specialized: ")[1][:60])
                    notes += [n[:70] for n in attrs.get("persistent", ())] + [n[:70] for n in attrs.get("bulk_store", ())]
                    timed.append((f"general {v}", (lambda kk=k, o=c: kk(a, b, o)), same, err, "; ".join(notes)))
                # --rounds N: every kernel of the tile timed once a round, N rounds in turn, the median reported (the
                # rows' order effects and the GPU's clock drift spread over all of them; D62)
                times = [[] for _ in timed]
                for _ in range(args.rounds):
                    for n, t in enumerate(timed):
                        times[n].append(event_ms(t[1], args.rep))
                meds = []
                for ts in times:
                    ts = sorted(ts)
                    meds.append(ts[len(ts) // 2] if len(ts) % 2 else (ts[len(ts) // 2 - 1] + ts[len(ts) // 2]) / 2)
                if timed and timed[0][0].endswith("(in the rounds)"):
                    ms_cublas = meds[0]
                for (kernel, _call, same, err, notes), ts, med in zip(timed, times, meds):
                    ts = sorted(ts)
                    if args.rounds > 1:
                        notes = f"median of {args.rounds} rounds ({ts[0]:.4f}-{ts[-1]:.4f} ms)" + \
                            (f"; {notes}" if notes else "")
                    row(kernel, tile, med, same, err, notes)
    return 0


def census() -> int:
    """Compile-only: every catalog case with a T.gemm on cuda:sm_90a, with the plugin's pipeline kept and by default
    (the plain GEMM routed to the general path, D58)."""
    import collections

    from tilecore.compiler import lower
    from tilecore.errors import TilecoreError
    from tilecore_conformance.catalog import catalog

    rows = collections.Counter()
    print("| case | the plugin's pipeline kept (tilecore.cuda.general_plain_gemm=False) | default (routed, D58) |")
    print("|---|---|---|")
    for case in catalog():
        if "gemm" not in case.id:
            continue
        out = []
        for cfg in ({"tilecore.cuda.general_plain_gemm": False}, {}):
            try:
                low = lower(case.build(**case.params), "cuda:sm_90a", {**case.pass_configs, **cfg})[2]
            except TilecoreError as e:
                out.append(f"refused: {type(e).__name__}")
                continue
            notes = " ".join(low.attrs.get("hopper_pipelines", ()))
            hopper = "cuda.hopper_gemm_pipeline: " in notes and "left to the core" not in notes \
                and "not pipelined" not in notes
            if hopper:
                what = "Hopper pipeline" + (", split-K" if "; split-K " in notes else "")
            elif "hopper_register_program: " in notes and "fragments in registers" in notes:
                what = "register program"
            else:
                what = "general path" + "".join(f" +{k}" for k in ("bulk_store", "persistent", "matrix_stores")
                                                if any(not n.startswith("not") for n in low.attrs.get(k, ())))
            out.append(what)
        rows[tuple(out)] += 1
        print(f"| {case.id} | {out[0]} | {out[1]} |")
    print()
    for (a, b), n in rows.most_common():
        print(f"{n:4d}  {a}  ->  {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
