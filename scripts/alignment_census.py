"""Census of the global copies a target could move in wide (vector / asynchronous) runs, and how many are proven aligned.

Lowers every conformance-catalog kernel (and, with ``--corpus``, the TileLang corpus examples in
tests/tilelang_corpus) for each target given (default ``cuda:sm_80``) and looks, just before the pipelining slot, at
every *copy nest*: a nest of parallel loops around one ``Store(dst, BufferLoad(src))`` (maybe under an in-bounds
select) with one side a global tensor, which is what the core's generic copy lowering makes. Two kinds:

``staged``  the copies that open a ``T.Pipelined`` body, which ``tilecore.plan_pipelines`` turns into asynchronous
            copies: *proven* means the planner issued runs of 16 bytes (or of the widest width the target allows);
``other``   every other global copy nest (global to fragment / local / shared outside a pipeline, and stores back to
            global): no emitter vectorizes them today; *proven* means the planner's own proof
            (``tilecore.passes.pipeline.async_copy_nest``) would give them the widest run.

A copy that is not proven is put in one class by why (the first that applies): ``dynamic row length`` (a tensor's
row length or stride is a symbol, and its divisibility is the only missing fact), ``row length`` (a static row length
that is not a multiple of the run), ``start`` (the first element's offset is not a provable multiple of the run),
``tile`` (the innermost loop is not a whole number of runs, or not contiguous), ``element size`` (no run of the
target's widths fits the element); ``not planned`` counts staged copies of loops the planner left serial (the
reason is in ``kernel.meta["attrs"]["pipelines"]``). A proof that holds only under a run-time test of a symbol's divisibility (the
planner's versioned copies, ``if n % k == 0``) is counted as ``versioned``.

    python scripts/alignment_census.py [--target cuda:sm_80 --target hip:gfx950] [--corpus] [--json out.json]

Prints one table per target. Slow part: lowering (about 20 s for the catalog on one core; the corpus about as much).
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _copy_nests(body):
    """Copy nests of ``body`` (outermost parallel loops whose nest is a plain element copy), with their kind."""
    from tilecore.ir import BufferLoad, For, Select, Seq, Store, const_value, walk

    found = []

    def parts(nest):
        loops, s = [], nest
        while isinstance(s, For) and s.kind in ("parallel", "vectorized"):
            loops.append(s)
            s = s.body
            while isinstance(s, Seq) and len(s.body) == 1:
                s = s.body[0]
        if not loops or not isinstance(s, Store):
            return None
        v = s.value
        if isinstance(v, Select) and const_value(v.f) == 0:
            v = v.t
        if not isinstance(v, BufferLoad) or v.buffer.dtype != s.buffer.dtype:
            return None
        if "global" not in (v.buffer.scope, s.buffer.scope) or v.buffer.scope == s.buffer.scope:
            return None
        return loops, s, v

    inner: set = set()

    def visit(x):
        if isinstance(x, For) and x.kind in ("parallel", "vectorized") and id(x) not in inner:
            walk(x.body, lambda y: inner.add(id(y)))
            p = parts(x)
            if p is not None:
                found.append((x, p, bool(x.annotations.get("pipeline_stage"))))

    walk(body, visit)
    return found


def _why(parts, nbytes: int) -> str:
    """The census's own reading of why a run of ``nbytes`` is not proven (for the table; the proof is the planner's)."""
    from tilecore.ir import Var, const_value, simplify, walk_expr

    loops, store, load = parts
    es = store.buffer.dtype.bytes
    if nbytes % es:
        return "element size"
    elems = nbytes // es
    j = loops[-1]
    ext = const_value(simplify(j.extent))
    if const_value(j.start) != 0 or not isinstance(ext, int) or ext % elems:
        return "tile"
    for buf, idx in ((store.buffer, store.indices), (load.buffer, load.indices)):
        last = idx[-1]
        used: list = []
        walk_expr(last, lambda x: used.append(1) if x is j.var else None)
        if not used:
            return "tile"
    symbolic = []
    for buf in (store.buffer, load.buffer):
        dims = buf.shape[1:] if len(buf.shape) > 1 else buf.shape
        for d in dims:
            if const_value(simplify(d)) is None:
                walk_expr(d, lambda x: symbolic.append(x) if isinstance(x, Var) else None)
            elif int(const_value(simplify(d))) % elems:
                return "row length"
    if symbolic:
        return "dynamic row length"
    return "start"


def census(targets, corpus: bool):
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "conformance"))
    import tilecore.passes.pipeline as pl
    from tilecore.compiler import lower
    from tilecore.errors import TilecoreError
    from tilecore.ir import If
    from tilecore_conformance.catalog import catalog

    kernels = [(f"catalog/{c.id}", (lambda c=c: c.build(**c.params))) for c in catalog()]
    if corpus:
        for p in sorted((ROOT / "tests" / "tilelang_corpus").glob("*.py")):
            if p.stem.startswith("_"):
                continue
            try:
                mod = importlib.import_module(f"tilelang_corpus.{p.stem}")
            except Exception as e:  # noqa: BLE001 - an example that does not import is reported, not fatal
                print(f"corpus/{p.stem}: not imported ({type(e).__name__}: {e})", file=sys.stderr)
                continue
            for k, (fn, args, kwargs) in enumerate(getattr(mod, "KERNELS", ())):
                fn = getattr(fn, "jit_fn", fn)

                def build(fn=fn, args=args, kwargs=kwargs):
                    return fn.get_tir(*args, **kwargs) if hasattr(fn, "get_tir") else fn(*args, **kwargs)

                kernels.append((f"corpus/{p.stem}/{k}", build))

    orig_plan, orig_nest = pl.plan_pipelines, pl.async_copy_nest
    results = {}
    for target in targets:
        rows = []
        seen_staged: dict = {}

        def nest_hook(nest, widths=pl.COPY_BYTES, *facts):
            out = orig_nest(nest, widths, *facts)
            parts = pl._copy_parts(nest)
            if parts is not None:  # the planner's statements are rebuilt copies: key by the shared buffer filled
                seen_staged[id(parts[1].buffer)] = out
            return out

        def plan_hook(func, ctx, _target=target):
            nests = _copy_nests(func.body)
            out = orig_plan(func, ctx)
            widths = pl.copy_bytes(ctx)
            for nest, parts, staged in nests:
                es = parts[1].buffer.dtype.bytes
                want = next((w for w in widths if w % es == 0), None)
                if staged and id(parts[1].buffer) in seen_staged:
                    new, how = seen_staged[id(parts[1].buffer)]
                elif staged:
                    new, how = nest, "not planned"
                else:
                    new, how = orig_nest(nest, widths)
                versioned = isinstance(new, If)
                if staged and how == "not planned":
                    verdict = "not planned"
                elif want is None:
                    verdict = "element size"
                elif how == want and not versioned:
                    verdict = "proven"
                elif versioned and how == want:
                    verdict = "versioned"
                else:
                    verdict = _why(parts, want)
                rows.append({"kernel": current[0], "staged": staged, "dtype": str(parts[1].buffer.dtype),
                             "width": want, "planned": how if isinstance(how, int) else None,
                             "verdict": verdict})
            return out

        pl.plan_pipelines, pl.async_copy_nest = plan_hook, nest_hook
        current = [""]
        failed = 0
        try:
            for name, build in kernels:
                current[0] = name
                seen_staged.clear()
                try:
                    lower(build(), target=target, pass_configs={"tilecore.disable_cache": True})
                except TilecoreError:
                    failed += 1  # refused by the target's profile: nothing to count
                except Exception as e:  # noqa: BLE001
                    failed += 1
                    print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            pl.plan_pipelines, pl.async_copy_nest = orig_plan, orig_nest
        results[target] = {"rows": rows, "kernels": len(kernels), "refused": failed}
    return results


COLUMNS = ("not planned", "proven", "versioned", "dynamic row length", "row length", "start", "tile", "element size")


def table(target, res) -> str:
    lines = [f"## {target}: {res['kernels']} kernels lowered ({res['refused']} refused by the target)", "",
             "| copies | candidates | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for label, pick in (("staged (T.Pipelined)", lambda r: r["staged"]), ("other global", lambda r: not r["staged"]),
                        ("all", lambda r: True)):
        rows = [r for r in res["rows"] if pick(r)]
        count = collections.Counter(r["verdict"] for r in rows)
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(str(count.get(c, 0)) for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", help="target to lower for (repeatable; default cuda:sm_80)")
    ap.add_argument("--corpus", action="store_true", help="also the TileLang corpus examples (tests/tilelang_corpus)")
    ap.add_argument("--json", help="write every counted copy (kernel, kind, dtype, verdict) to this file")
    args = ap.parse_args(argv)
    res = census(args.target or ["cuda:sm_80"], args.corpus)
    for target, r in res.items():
        print(table(target, r))
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
