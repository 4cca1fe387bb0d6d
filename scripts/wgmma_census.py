#!/usr/bin/env python
"""The retired sm_90a (WGMMA) register program's form against the core's general path: which kernels it would take
and whether the general path reaches registers for them (decisions D77, D86).

    python scripts/wgmma_census.py                # the catalog, the TileLang corpus and the attention benchmark's forms
    python scripts/wgmma_census.py --json out.json
    python scripts/wgmma_census.py -k attention

Each kernel is lowered for ``cuda:sm_90a`` (``tilecore.compiler.lower``, no device compiler) with
``tilecore.cuda.register_programs=True`` (refused since D86 exactly where the retired program would take the kernel:
"retired"), with the defaults and with ``tilecore.cuda.register_programs=False`` (the general path). A row gives the path taken
(``tilecore_cuda.lowering_path``; ``kernel.meta["attrs"]["hopper_pipelines"]`` has the notes) and, on the general
path, how many fragments are in registers (``fragment_layouts``) and whether a matrix unit's layout holds them
(``wgmma``). Kernels no WGMMA register program takes in any mode are counted by their paths.

``--split-k`` (D84): which GEMMs the CUDA plugin's split-K (``cuda.hopper_gemm_pipeline``'s ``tc_wgmma_splitk``)
takes by default, and why the route to the core's group sum (``tilecore_cuda.hopper.split_k_route``) leaves each
there: the catalog, the TileLang corpus and the split-K benchmarks' GEMMs (``benchmarks/general_splitk.py``'s shapes at
its tiles; ``benchmarks/cuda_gemm.py``'s LLM set (4096,4096,14336), (4096,14336,4096), (128,4096,4096),
(16,8192,8192) at its configurations, fp16 / bf16 / e4m3 operands, fp16 and fp32 C), each lowered with the defaults
and with ``--with`` (pass configs as JSON: what a new option moves):

    python scripts/wgmma_census.py --split-k [--with '{"tilecore.cuda.general_split_k_8bit": true}']
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

TARGET = "cuda:sm_90a"
MODES = {"forced": {"tilecore.cuda.register_programs": True}, "default": {},
         "general": {"tilecore.cuda.register_programs": False}}
#: FlashAttention's forms the attention benchmark times (benchmarks/cuda_attention.py; D77's device step), at a small
#: sequence: (head dimension, KV heads or None, block rows, key block, threads)
BENCH_FORMS = [(64, None, 128, 128, 256), (64, None, 128, 176, 256), (128, None, 128, 128, 256),
               (128, None, 128, 176, 256), (128, 8, 128, 128, 256), (256, None, 128, 64, 256),
               (128, None, 64, 64, 128), (64, None, 64, 64, 128), (256, None, 64, 64, 128)]


def classify(build, configs: dict) -> tuple:
    """(path, notes): the path one kernel takes on cuda:sm_90a with ``configs``."""
    import tilecore_cuda
    from tilecore.compiler import lower

    try:
        attrs = lower(build(), TARGET, {**configs, "tilecore.disable_cache": True})[2].attrs
    except Exception as e:  # noqa: BLE001 - a refusal is a row
        return f"refused ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})", ()

    class _K:
        meta = {"attrs": attrs}

    notes = tuple(attrs.get("hopper_pipelines", ()))
    path = tilecore_cuda.lowering_path(_K)
    if path != "generic":
        return path.replace("register program", "regprog"), notes
    frags = dict(attrs.get("fragment_layouts") or {})
    if not frags:
        return "general, no fragments", notes
    shared = [f for f, lay in frags.items() if str(lay).startswith("shared")]
    unit = " (wgmma)" if any(str(lay).startswith("wgmma") for lay in frags.values()) else ""
    why = ""
    if shared:
        why = ": " + "; ".join(f"{f} {str(frags[f])[:90]}" for f in shared[:2])
    return ("general, registers" if not shared else
            f"general, {len(frags) - len(shared)}/{len(frags)} in registers{why}") + unit, notes


def bench_funcs():
    """The attention benchmark's kernel (the catalog's, at benchmark blocks) for each form of BENCH_FORMS, causal and
    not, the exact build and fast math, at b1 h4 s512."""
    from tilecore_conformance.composite import flash_attention_forward

    for d, kv, bm, bn, threads in BENCH_FORMS:
        for causal in (False, True):
            for fast in (False, True):
                name = (f"bench/d{d}{'-gqa' if kv else ''} {bm}x{bn}{' causal' if causal else ''}"
                        f"{' fast' if fast else ''}")
                heads = 32 if kv else 4

                def build(d=d, kv=kv, bm=bm, bn=bn, threads=threads, causal=causal, heads=heads):
                    return flash_attention_forward(512, d, heads, bm, bn, "float16", causal, batch=1, threads=threads,
                                                   num_stages=2, kv_heads=kv)

                yield name, build, {"tilecore.fast_math": fast}


def sources(corpus: bool = True):
    from fragment_census import catalog_funcs, corpus_funcs

    for name, build, configs in catalog_funcs():
        yield name, build, configs or {}
    for name, build, configs in bench_funcs():
        yield name, build, configs
    if corpus:
        for name, build, configs in corpus_funcs():
            if not isinstance(build, Exception):
                yield name, build, configs or {}


#: benchmarks/cuda_gemm.py's LLM set (issue 17) and the operand / C types the split-K census lowers it in
LLM_SHAPES = ((4096, 4096, 14336), (4096, 14336, 4096), (128, 4096, 4096), (16, 8192, 8192))
SPLIT_TYPES = (("float16", "float16"), ("float16", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32"),
               ("float8_e4m3", "float16"), ("float8_e4m3", "float32"))


def gemm_funcs():
    """(name, builder, pass configs) of the split-K benchmarks' GEMMs: benchmarks/general_splitk.py's shapes at the
    plugin's tile and its --tiles (fp16), and benchmarks/cuda_gemm.py's LLM set at its configurations (8-bit: its
    fp8 configurations and the small-M ones at a 128-element k step, B as (N, K)) in every type of SPLIT_TYPES."""
    import cuda_gemm
    import general_splitk

    from cuda_gemm import matmul

    seen = set()

    def one(M, N, K, cfg, dt, out):
        bm, bn, bk, th, st = cfg[:5]
        key = (M, N, K, bm, bn, bk, th, st, dt, out)
        if key in seen:
            return None
        seen.add(key)
        name = f"bench/{M}x{N}x{K} {bm}x{bn}x{bk}/{st} {dt} C {out}"
        return name, (lambda: matmul(M, N, K, bm, bn, bk, threads=th, num_stages=st, dtype=dt, out_dtype=out,
                                     b_transposed=dt.startswith("float8"))), {}

    rows = []
    for s in general_splitk.SHAPES.split(","):
        M, N, K = (int(x) for x in s.split("x"))
        for cfg in [general_splitk.PLUGIN_TILES.get(s, (128, 128, 64, 256, 4))] + \
                [general_splitk.parse_tile(t) for t in general_splitk.TILES.split(",")]:
            rows.append(one(M, N, K, cfg, "float16", "float16"))
    for M, N, K in LLM_SHAPES:
        for dt, out in SPLIT_TYPES:
            if dt.startswith("float8"):
                cfgs = list(cuda_gemm.FP8_CONFIGS) + ([c[:2] + (128,) + c[3:] for c in cuda_gemm.SMALL_M_CONFIGS]
                                                      if M <= 256 else [])
            else:
                cfgs = list(cuda_gemm.CONFIGS) + (list(cuda_gemm.SMALL_M_CONFIGS) if M <= 256 else [])
            for cfg in cfgs:
                rows.append(one(M, N, K, cfg, dt, out))
    yield from (r for r in rows if r is not None)


def split_k_row(build, configs: dict) -> str:
    """Where one kernel's split-K goes on cuda:sm_90a: "not split", "core (S splits)" or "plugin (S): the route's
    reason" (``SPLIT_K_KEPT``'s note)."""
    import re

    from tilecore.compiler import lower
    from tilecore_cuda.hopper import SPLIT_K_KEPT

    try:
        attrs = lower(build(), TARGET, {**configs, "tilecore.disable_cache": True})[2].attrs
    except Exception as e:  # noqa: BLE001 - a refusal is a row
        return f"refused ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    notes = attrs.get("hopper_pipelines", ())
    core = [n for n in notes if "with the core's split-K over" in n]
    if core:
        count = re.search(r"over (\d+) blocks", core[0]).group(1)
        return f"core ({count} splits)"
    m = next((re.search(r"split-K (\d+) ", n) for n in notes if re.search(r"split-K (\d+) ", n)), None)
    if m is None:
        return "not split"
    kept = next((n[len(SPLIT_K_KEPT):] for n in notes if n.startswith(SPLIT_K_KEPT)), "?")
    return f"plugin ({m.group(1)}): {kept}"


def split_k_census(args) -> int:
    extra = json.loads(args.with_) if args.with_ else {}
    srcs = list(gemm_funcs()) + list(sources(not args.no_corpus))
    rows = []
    for name, build, configs in srcs:
        if args.k and args.k not in name:
            continue
        row = {"kernel": name, "default": split_k_row(build, configs)}
        if row["default"] == "not split" or row["default"].startswith("refused"):
            rows.append(row)
            continue
        if extra:
            row["with"] = split_k_row(build, {**configs, **extra})
        rows.append(row)
    split = [r for r in rows if r["default"].startswith(("plugin", "core"))]
    print("| kernel | default" + (" | with --with" if extra else "") + " |")
    print("|---|---" + ("|---" if extra else "") + "|")
    for r in split:
        print(f"| {r['kernel']} | {r['default']}" + (f" | {r.get('with', '')}" if extra else "") + " |")
    plug = [r for r in split if r["default"].startswith("plugin")]
    why = collections.Counter(r["default"].split(": ", 1)[-1] for r in plug)
    print(f"\n{len(rows)} kernels lowered; {len(split)} split over K by default: {len(split) - len(plug)} on the core's "
          f"group sum, {len(plug)} on the plugin's split-K, by the route's reason:")
    for key, n in why.most_common():
        print(f"  {n:4d}  {key}")
    if extra:
        moved = [r for r in plug if r.get("with", "").startswith("core")]
        print(f"with {json.dumps(extra)}: {len(moved)} of the {len(plug)} move to the core")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("-k", help="only kernels whose name contains this")
    ap.add_argument("--no-corpus", action="store_true", help="leave the TileLang corpus out")
    ap.add_argument("--split-k", action="store_true", help="the split-K census (D84): which GEMMs the plugin's "
                    "split-K takes by default and the route's reason for each")
    ap.add_argument("--with", dest="with_", help="--split-k: pass configs (JSON) for a second column")
    args = ap.parse_args(argv)
    if args.split_k:
        return split_k_census(args)
    rows = []
    for name, build, configs in sources(not args.no_corpus):
        if args.k and args.k not in name:
            continue
        row = {"kernel": name}
        forced, _ = classify(build, {**configs, **MODES["forced"]})
        row["forced"] = forced
        if "register_programs=True: the WGMMA register program" in forced:  # (D86's refusal, its first 80 characters)
            row["forced"] = forced = "retired (D86)"
            for mode in ("default", "general"):
                row[mode], _ = classify(build, {**configs, **MODES[mode]})
        rows.append(row)
    taken = [r for r in rows if r["forced"] == "retired (D86)"]
    print("| kernel | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 1) + "|")
    for r in taken:
        print(f"| {r['kernel']} | " + " | ".join(r[m] for m in MODES) + " |")
    print()
    rest = collections.Counter(r["forced"].split(":")[0] for r in rows if r not in taken)
    print(f"{len(rows) - len(taken)} kernels not of the retired WGMMA register program's form (their path with "
          "register_programs=True, counts):")
    for key, n in rest.most_common():
        print(f"  {n:4d}  {key}")
    served = [r for r in taken if r["general"].startswith("general, registers")]
    print(f"\n{len(taken)} kernels of the retired WGMMA register program's form (D86); the default route compiles "
          f"{sum(not r['default'].startswith('regprog') for r in taken)} on the general path; with "
          f"register_programs=False {len(served)} of them reach registers with every fragment "
          f"({sum('(wgmma)' in r['general'] for r in served)} on the matrix unit's layout)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
