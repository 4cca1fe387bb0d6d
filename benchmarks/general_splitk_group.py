"""The core's split-K summed in a block group (``tilecore.split_k_reduce="group"``, D75) against its workspace sum
(D69), the CUDA plugin's split-K (its default: the cluster sum, D41) and cuBLAS.

    python benchmarks/general_splitk_group.py [--shapes 128x4096x4096,16x8192x8192] [--rounds 6] [--batch 10]

For every shape, in one process, the README GEMM (``cuda_gemm.matmul``, fp16, C fp16) compiled as:

- ``plugin``: no pass configs (the plugin's pipeline, its split-K rule and cluster sum: the bar's reference);
- ``plugin-global``: the plugin's workspace sum;
- ``ws S tile`` / ``group S tile``: the core's general path with ``tilecore.split_k=S`` and
  ``tilecore.split_k_reduce="workspace"`` / ``"group"`` at each tile of ``--tiles`` and each S of ``--splits`` that
  divides the k tiles (``group-stages``: the receive area over the stages, ``tilecore.split_k_group_area``;
  ``group-cb``: the peers' stores completing on rank 0's transaction barrier, ``tilecore.split_k_group_sync``);
  ``... Su``: ``--uneven`` counts at the plugin's tile that do not divide its k tiles (``tilecore.split_k_uneven``);
  from 3 splits ``group`` sums in slices (``tilecore.split_k_group_sum`` "auto"), ``group-r0`` all into rank 0; ``auto tile``: ``tilecore.split_k="auto"`` with ``split_k_reduce="auto"``;
- ``routed ...``: ``tilecore.cuda.general_split_k=True`` (the plugin's tile and rule's count on the general path)
  with the workspace sum and with ``split_k_reduce="auto"``.

``--cells``: the 3-split rows (D78): at the plugin's tile (``CELLS_TILES`` adds 64x8192x8192 at 64x256, every row
valid), the plugin (its cluster sum), its workspace sum, the default routing at that tile and the routing with
``tilecore.cuda.general_split_k_cells=True`` (each dropped where it keeps the plugin's kernel), the core's workspace / cells / slices sums at ``--cells-splits`` (uneven where the count does not
divide the k tiles; ``cells-stages``: the cells' area over the pipeline's stages, ``tilecore.split_k_group_area``;
each group kernel checked bit for bit against the workspace kernel) and D75's routed 64x128
tile for the record.

``--focus``: the routing rows (D75 round 2): at the plugin's tile and each tile of ``--tiles`` the plugin and the
same kernel with ``tilecore.cuda.general_split_k="group"`` (routed where the core sums it in block groups), the
core's workspace / group ("auto": in panels where the epilogue's bulk store has 2 panels, else rank 0) / group-r0
(all into rank 0) sums at 2 splits.

torch.matmul (cuBLAS) in the same run is the reference. Times: CUDA events around each call, ``--batch`` calls a
batch issued while the GPU sleeps, variants interleaved round by round, the order reversed every other round (both
orders), the median of every call. Every result is checked against a float64 product; every kernel bit for bit
across two calls; every group kernel bit for bit against the workspace kernel of its tile and split count (the same
additions in the same order). Prints ratios to cuBLAS and to ``plugin``. Without a GPU: compiles one group kernel,
exits 3.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tilecore

sys.path.insert(0, str(Path(__file__).parent))
from cuda_gemm import NO_GPU_EXIT, has_gpu, matmul, split_k_of  # noqa: E402
from general_splitk import GENERAL, PLUGIN, PLUGIN_TILES, check_and_time, parse_tile, shape_rows  # noqa: E402  (D69's benchmark: the same rows)

TILES = "128x128x64/256/4,64x128x64/128/4,128x64x64/256/4"
#: --cells (D78): a shape whose 64x256 tile has every row valid, at that tile
CELLS_TILES = {"64x8192x8192": (64, 256, 64, 128, 3)}
#: --wide (D84): (operand type, C type, tile) of the split GEMMs the plugin keeps by default for their types: 8-bit
#: operands at the fp8 benchmark's k step (2 splits in panels, 3 in cells) and a 32-bit C (2 splits in panels at
#: 64x128, 4 panels; 3 splits in cells, the area beside the stages at 128x128x64/3 and only over them at /5); D75's
#: 16-bit 64x128x64/4 in panels against the same in cells (rows past C not exchanged)
WIDE = (("float8_e4m3", "float16", (128, 128, 128, 256, 4)), ("float8_e4m3", "float16", (64, 256, 128, 128, 3)),
        ("float8_e4m3", "float16", (64, 128, 128, 128, 4)), ("float16", "float32", (64, 128, 64, 128, 4)),
        ("float16", "float32", (128, 128, 64, 256, 3)), ("float16", "float32", (128, 128, 64, 256, 5)),
        ("float16", "float16", (64, 128, 64, 128, 4)))
#: the options that route them (D84)
WIDE_OPTIONS = {"tilecore.cuda.general_split_k_8bit": True, "tilecore.cuda.general_split_k_c32": True}


def wide(M: int, N: int, K: int, rows, args) -> int:
    """--wide: for each operand / C type of ``rows`` one table: at each of its tiles the plugin's split-K, the same GEMM
    as the defaults route it (``default``, where routed), routed by WIDE_OPTIONS (``routed``, where another kernel)
    and with ``general_split_k_cells=True`` too where that routes more (``routed-any``), the routed kernel summed in
    cells where it was not (``cells``: ``tilecore.split_k_group_sum="cells"``, whose cells past C's rows are not
    exchanged, unlike the panels'); cuBLAS (torch.matmul, C in
    the operands' type) or torch._scaled_mm (8-bit) the reference. Returns the failures."""
    failures = 0
    for dt, out in dict.fromkeys((d, o) for d, o, _ in rows):
        variants, add, ref, bound = shape_rows(M, N, K, dt, out)
        for _, _, t in (r for r in rows if r[:2] == (dt, out)):
            tn = f"{t[0]}x{t[1]}x{t[2]}/{t[4]}"
            kp = add(f"plugin {tn}", tile=t, cfg=PLUGIN)
            if kp is None or split_k_of(kp) == 1:
                variants.pop(f"plugin {tn}", None)
                print(f"  {tn}: the plugin does not split it")
                continue
            codes = set()
            for label, cfg in ((f"default {tn}", {}), (f"routed {tn}", WIDE_OPTIONS),
                               (f"routed-any {tn}", {**WIDE_OPTIONS, "tilecore.cuda.general_split_k_cells": True}),
                               (f"cells {tn}", {**WIDE_OPTIONS, "tilecore.split_k_group_sum": "cells"})):
                k = add(label, tile=t, cfg=cfg)
                if k is None:
                    continue
                split = k.meta.get("attrs", {}).get("split_k")
                kept = [n for n in k.meta.get("attrs", {}).get("hopper_pipelines", ()) if "kept on this" in n]
                if not split:  # the plugin's kernel: the route's reason
                    del variants[label]
                    print(f"  {label}: not routed: {kept[0].split(': ', 2)[-1] if kept else '?'}")
                elif k.source.code in codes:
                    del variants[label]  # the same kernel as a row above
                else:
                    codes.add(k.source.code)
                    print(f"  {label}: {split[0][-200:]}")
        print(f"\n{M}x{N}x{K}, {dt} operands, C {out}:")
        med, bad = check_and_time(variants, ref, bound, rounds=args.rounds, batch=args.batch,
                                  sleep_cycles=args.sleep_cycles, both_orders=True)
        failures += bad
        cub = med["cublas"]
        print(f"{'variant':30s} {'us':>8s} {'x ref':>9s} {'x plugin, same tile':>19s}")
        for label, us in med.items():
            same = med.get(f"plugin {label.split(' ')[-1]}")
            rs = f"{same / us:19.3f}" if same and label != "cublas" else f"{'-':>19s}"
            print(f"{label:30s} {us:8.2f} {cub / us:9.3f} {rs}")
        sys.stdout.flush()
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="128x4096x4096,16x8192x8192")
    ap.add_argument("--tiles", default=TILES)
    ap.add_argument("--splits", default="2,4")
    ap.add_argument("--uneven", default="3", help="split counts tried at the plugin's tile where they do not divide "
                    "the k tiles (tilecore.split_k_uneven)")
    ap.add_argument("--focus", action="store_true", help="the routing rows only: at the plugin's tile and each of "
                    "--tiles, the plugin, the same kernel with tilecore.cuda.general_split_k=\"group\", the core's "
                    "workspace, group and group-r0 sums at 2 splits (D75 round 2)")
    ap.add_argument("--cells", action="store_true", help="the 3-split rows (D78): at the plugin's tile, the plugin "
                    "(its cluster sum), its workspace sum, the core's workspace / cells / slices sums at --cells-splits "
                    "(uneven where they must be), the kernel routed by tilecore.cuda.general_split_k=\"group\" "
                    "and D75's routed 64x128 tile")
    ap.add_argument("--cells-splits", default="3")
    ap.add_argument("--wide", action="store_true", help="the 8-bit and 32-bit C rows (D84): the plugin's split-K "
                    "against the same GEMM routed to the core's group sum by tilecore.cuda.general_split_k_8bit / "
                    "_c32 (WIDE), torch.matmul / torch._scaled_mm the reference")
    ap.add_argument("--wide-rows", default="", help="--wide: only the WIDE rows whose 'type:C:tile' contains one "
                    "of these comma-separated strings (e.g. float8,float32:128x128)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--sleep-cycles", type=int, default=4_000_000)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    tiles = [parse_tile(t) for t in args.tiles.split(",") if t]
    splits = [int(s) for s in args.splits.split(",") if s]
    if not has_gpu()[0]:
        M, N, K = shapes[0]
        bm, bn, bk, th, st = tiles[0]
        k = tilecore.compile(matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st), target="cuda:sm_90a",
                             pass_configs={**GENERAL, "tilecore.split_k": 2, "tilecore.split_k_reduce": "group"})
        print("no GPU: compiled", k.meta.get("attrs", {}).get("split_k"))
        return NO_GPU_EXIT
    import torch

    torch.manual_seed(0)
    failures = 0
    picks = [w for w in args.wide_rows.split(",") if w]
    rows = [r for r in WIDE if not picks or any(w in f"{r[0]}:{r[1]}:{r[2][0]}x{r[2][1]}x{r[2][2]}/{r[2][4]}"
                                                for w in picks)]
    for M, N, K in shapes:
        if args.wide:
            failures += wide(M, N, K, rows, args)
            continue
        name = f"{M}x{N}x{K}"
        variants, add, ref, bound = shape_rows(M, N, K)
        pairs = []  # (group label, workspace label): the same bits expected

        pt = PLUGIN_TILES.get(name, CELLS_TILES.get(name, (128, 128, 64, 256, 4)))
        if args.cells:  # D78: the plugin's default tile, 3 splits summed in cells against the plugin's cluster sum
            tn = f"{pt[0]}x{pt[1]}x{pt[2]}/{pt[4]}"
            kp = add("plugin", tile=pt, cfg=PLUGIN)
            add("plugin-global", tile=pt, cfg={**PLUGIN, "tilecore.cuda.split_k_reduce": "global"})
            for label, cfg in ((f"routed {tn}", {}),  # the default routing at the plugin's tile, and D78's
                               (f"routed cells {tn}", {"tilecore.cuda.general_split_k_cells": True})):
                k = add(label, tile=pt, cfg=cfg)
                if k is not None:
                    note = (k.meta.get("attrs", {}).get("split_k") or ("the plugin's split-K",))[0]
                    if "split_k" not in k.meta.get("attrs", {}) or (cfg and not k.source.meta.get("cluster")):
                        del variants[label]  # the plugin's kernel (or the core's workspace sum: not the cells)
                    print(f"  {label}: {note[:240]}")
            for s in [int(x) for x in args.cells_splits.split(",") if x]:
                cfg = {**GENERAL, "tilecore.split_k": s, "tilecore.split_k_uneven": True}
                u = "u" if (-(-K // pt[2])) % s else ""
                if add(f"ws {s}{u} {tn}", tile=pt, cfg=cfg) is None:
                    continue
                for label, form, extra in (("cells", "cells", {}),
                                           ("cells-stages", "cells", {"tilecore.split_k_group_area": "stages"}),
                                           ("slices", "slices", {})):
                    k = add(f"{label} {s}{u} {tn}", tile=pt, cfg={**cfg, "tilecore.split_k_reduce": "group",
                                                                "tilecore.split_k_group_sum": form, **extra})
                    if k is not None:
                        pairs.append((f"{label} {s}{u} {tn}", f"ws {s}{u} {tn}"))
                        print(f"  {label} {s}{u} {tn}: {k.meta['attrs']['split_k'][0][-200:]}")
            t = (64, 128, 64, 128, 4)
            if t != pt:  # D75's routed tile, for the record
                add("routed 64x128x64/4", tile=t, cfg={})
            tiles_here = []
        elif args.focus:  # the routing question: at each tile, the plugin against the same kernel routed to the core
            kp = add("plugin", tile=pt, cfg=PLUGIN)
            for t in [pt] + [x for x in tiles if x != pt]:
                tn = f"{t[0]}x{t[1]}x{t[2]}/{t[4]}"
                if t != pt:
                    add(f"plugin {tn}", tile=t, cfg=PLUGIN)
                k = add(f"routed group {tn}", tile=t, cfg={"tilecore.cuda.general_split_k": "group"})
                if k is not None and "split_k" not in k.meta.get("attrs", {}):
                    del variants[f"routed group {tn}"]  # not routed: the plugin's kernel
                    print(f"  routed group {tn}: not routed (the plugin's split-K)")
                kt = -(-K // t[2])
                if kt % 2 == 0:
                    if add(f"ws 2 {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": 2}) is not None:
                        for form, extra in (("group 2", {}), ("group-r0 2", {"tilecore.split_k_group_sum": "rank0"})):
                            if add(f"{form} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": 2,
                                                                "tilecore.split_k_reduce": "group", **extra}) is not None:
                                pairs.append((f"{form} {tn}", f"ws 2 {tn}"))
            tiles_here = []
        else:
            kp = None
            tiles_here = tiles
        kp = kp if args.focus or args.cells else add("plugin", tile=pt, cfg=PLUGIN)
        sp = split_k_of(kp) if kp is not None else 1
        cl = (kp.source.meta.get("cluster") if kp is not None else None)
        if args.focus or args.cells:
            args.uneven = ""
        else:
            add("plugin-global", tile=pt, cfg={"tilecore.cuda.split_k_reduce": "global"})
            add("routed ws", tile=pt, cfg={"tilecore.cuda.general_split_k": True})
        k = None if args.focus or args.cells else add("routed group-auto", tile=pt, cfg={"tilecore.cuda.general_split_k": True,
                                                                            "tilecore.split_k_reduce": "auto"})
        if k is not None:
            print(f"  routed group-auto: {(k.meta.get('attrs', {}).get('split_k') or ('-',))[0][:220]}")
        for s in [int(x) for x in args.uneven.split(",") if x]:  # counts that do not divide the k tiles, at the
            tn = f"{pt[0]}x{pt[1]}x{pt[2]}/{pt[4]}"                 # plugin's tile (tilecore.split_k_uneven)
            if (-(-K // pt[2])) % s == 0:
                continue
            cfg = {**GENERAL, "tilecore.split_k": s, "tilecore.split_k_uneven": True}
            if add(f"ws {s}u {tn}", tile=pt, cfg=cfg) is not None:
                for form, extra in (("group", {}), ("group-r0", {"tilecore.split_k_group_sum": "rank0"})):
                    k = add(f"{form} {s}u {tn}", tile=pt, cfg={**cfg, "tilecore.split_k_reduce": "group", **extra})
                    if k is not None:
                        pairs.append((f"{form} {s}u {tn}", f"ws {s}u {tn}"))
                        print(f"  {form} {s}u {tn}: {k.meta['attrs']['split_k'][0][-150:]}")
        for t in tiles_here:
            tn = f"{t[0]}x{t[1]}x{t[2]}/{t[4]}"
            kt = -(-K // t[2])
            for s in splits:
                if kt % s:
                    continue
                if add(f"ws {s} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": s}) is None:
                    continue
                if add(f"group {s} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": s,
                                                       "tilecore.split_k_reduce": "group"}) is not None:
                    pairs.append((f"group {s} {tn}", f"ws {s} {tn}"))
                if add(f"group-cb {s} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": s, "tilecore.split_k_reduce": "group",
                                                          "tilecore.split_k_group_sync": "copy_barrier"}) is not None:
                    pairs.append((f"group-cb {s} {tn}", f"ws {s} {tn}"))
                if s >= 3 and add(f"group-r0 {s} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": s,
                                                                     "tilecore.split_k_reduce": "group",
                                                                     "tilecore.split_k_group_sum": "rank0"}) is not None:
                    pairs.append((f"group-r0 {s} {tn}", f"ws {s} {tn}"))
                k = add(f"group-stages {s} {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": s,
                                                               "tilecore.split_k_reduce": "group",
                                                               "tilecore.split_k_group_area": "stages"})
                if k is not None and "over its stages" not in k.meta["attrs"]["split_k"][0]:
                    del variants[f"group-stages {s} {tn}"]  # the same kernel as "group" (the stages do not hold it)
                elif k is not None:
                    pairs.append((f"group-stages {s} {tn}", f"ws {s} {tn}"))
            k = add(f"auto {tn}", tile=t, cfg={**GENERAL, "tilecore.split_k": "auto", "tilecore.split_k_reduce": "auto"})
            if k is not None:
                print(f"  auto {tn}: {(k.meta.get('attrs', {}).get('split_k') or ('not split',))[0][:220]}")
        print(f"\n{name}: plugin tile {pt[0]}x{pt[1]}x{pt[2]}/{pt[4]}, plugin split-K {sp}, cluster {cl}")
        med, bad = check_and_time(variants, ref, bound, pairs, rounds=args.rounds, batch=args.batch,
                                  sleep_cycles=args.sleep_cycles, both_orders=True)
        failures += bad
        cub, plug = med["cublas"], med.get("plugin")
        print(f"{'variant':30s} {'us':>8s} {'x cuBLAS':>9s} {'x plugin':>9s} {'x plugin, same tile':>19s}")
        for label, us in med.items():
            rp = f"{plug / us:9.3f}" if plug else f"{'-':>9s}"
            tn = label.split(" ")[-1]
            same = med.get(f"plugin {tn}") or (plug if tn == f"{pt[0]}x{pt[1]}x{pt[2]}/{pt[4]}" else None)
            rs = f"{same / us:19.3f}" if same and label != "cublas" else f"{'-':>19s}"
            print(f"{label:30s} {us:8.2f} {cub / us:9.3f} {rp} {rs}")
        sys.stdout.flush()
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
