"""apache-tvm's analyzer as an oracle for the core's index arithmetic, over the whole conformance catalog.

Every catalog kernel is lowered (target ``cpu``, the reference) while the test records, through the core's
own functions, (1) every integer expression ``simplify()`` rewrote, with its result, and (2) every
comparison the bounds prover (``tilecore.ir.bounds.Facts.proves``, which elides guards) proved, with the
facts it had. The expressions go to ``tvm.sym.Analyzer`` in tilecore-tvm's worker process (TVM is a test
dependency here, never in the compile path):

- each simplification must be proven equal to its original (``can_prove(a == b)``);
- nothing the core proves may be refuted by TVM under the same facts (``can_prove(not cond)``);
- no divisibility the core claims (``Facts.divisor``: ``k`` divides ``e``, as the pipeline planner uses it to
  prove 16-byte alignment) may be refuted by TVM: ``floormod(e, k) == 0`` under the same facts, the conditions
  ``x % k == 0`` included. The catalog's float16 and float32 GEMMs, its pipelined and dynamic-shape cases and
  a GEMM with dynamic shapes are also lowered for ``cuda:sm_80``, whose planner asks the most of it.

Loads, calls and other non-integer atoms become opaque variables (the same atom, the same variable).
"""
from __future__ import annotations

import importlib.util
import sys

import pytest

from tilecore.errors import TilecoreError

tilecore_tvm = pytest.importorskip("tilecore_tvm")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tvm") is None,
                                reason="apache-tvm is not installed: " + tilecore_tvm.INSTALL_HINT)


def _program():
    from tilecore.ir import BinOp, Cast, Cmp, IntImm, Logic, ThreadIndex, Var, is_float
    from tilecore.ir.simplify import atom_key
    from tilecore_tvm.bridge import Program

    class Oracle(Program):
        """The bridge's expression writer; what is not integer arithmetic becomes an opaque variable."""

        def __init__(self):
            super().__init__("oracle")
            self.opaque: dict = {}
            self.keep: list = []  # the atoms themselves: their keys hold ids

        def expr(self, e):
            integer = not is_float(e.dtype)
            if isinstance(e, (Var, IntImm, ThreadIndex)) or (integer and isinstance(e, (BinOp, Cmp, Logic))):
                return super().expr(e)
            if isinstance(e, Cast) and integer and not is_float(e.value.dtype) and e.dtype == e.value.dtype:
                return self.expr(e.value)
            key = atom_key(e)
            if key not in self.opaque:
                self.opaque[key] = Var(f"atom{len(self.opaque)}", e.dtype if integer else "int32")
                self.keep.append(e)
            return super().expr(self.opaque[key])

    return Oracle()


@pytest.fixture(scope="module")
def recorded():
    """(simplify pairs, proven comparisons with their facts) over the catalog, lowered for ``cpu``."""
    import tilecore.ir.bounds  # noqa: F401 - the modules, not the functions tilecore.ir re-exports
    import tilecore.ir.simplify  # noqa: F401
    from tilecore.compiler import lower
    from tilecore.ir import BinOp, Expr, is_float
    from tilecore_conformance.catalog import catalog

    bounds, simp = sys.modules["tilecore.ir.bounds"], sys.modules["tilecore.ir.simplify"]
    pairs, proofs, divisions, seen, vars_ = [], [], [], set(), {}
    orig_simplify, orig_proves, orig_with_range = simp.simplify, bounds.Facts.proves, bounds.Facts.with_range
    orig_divisor = bounds.Facts.divisor

    def simplify(e):
        out = orig_simplify(e)
        if isinstance(e, BinOp) and isinstance(out, Expr) and not is_float(e.dtype) and out is not e:
            k = simp.atom_key(e)
            if k not in seen:
                seen.add(k)
                pairs.append((e, out))
        return out

    def with_range(self, var, lo, hi):
        vars_[id(var)] = var
        return orig_with_range(self, var, lo, hi)

    def proves(self, cond):
        ok = orig_proves(self, cond)
        if ok:
            proofs.append((dict(self.ranges), tuple(self.known), cond, dict(self.divs)))
        return ok

    def divisor(self, e, depth=0):
        d = orig_divisor(self, e, depth)
        if depth == 0 and d != 1:
            divisions.append((dict(self.ranges), tuple(self.known), e, d, dict(self.divs)))
        return d

    patched = [(m, "simplify") for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("tilecore") and getattr(m, "simplify", None) is orig_simplify]
    for m, name in patched:
        setattr(m, name, simplify)
    bounds.Facts.proves, bounds.Facts.with_range, bounds.Facts.divisor = proves, with_range, divisor
    lowered = 0
    gpu = [(c.build(**c.params), "cuda:sm_80") for c in catalog()  # the planner's copies: 2- and 4-byte elements
           if c.family in ("pipelined", "dynamic") or c.family == "gemm" and c.params["dtype"] in ("float16", "float32")]
    gpu += [(_dynamic_gemm(dtype), "cuda:sm_80") for dtype in ("float16", "float32")]
    try:
        import tilecore_cuda  # noqa: F401
    except ImportError:
        gpu = []
    try:
        for fn, target in [(c.build(**c.params), "cpu") for c in catalog()] + gpu:
            try:
                lower(fn, target=target, pass_configs={"tilecore.disable_cache": True})
                lowered += 1
            except TilecoreError:
                pass  # a case the target refuses (its profile): no index arithmetic to check
    finally:
        for m, name in patched:
            setattr(m, name, orig_simplify)
        bounds.Facts.proves, bounds.Facts.with_range = orig_proves, orig_with_range
        bounds.Facts.divisor = orig_divisor
    return {"pairs": pairs, "proofs": proofs, "divisions": divisions, "vars": vars_, "lowered": lowered}


def _dynamic_gemm(dtype):
    """A pipelined GEMM with M, N and K shape symbols (the planner versions its copies on N and K)."""
    import tilecore.language as T

    M, N, K = T.dynamic("M"), T.dynamic("N"), T.dynamic("K")

    @T.prim_func
    def kernel(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_s = T.alloc_shared((64, 32), dtype)
            B_s = T.alloc_shared((32, 64), dtype)
            C_l = T.alloc_fragment((64, 64), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, 32), num_stages=3):
                T.copy(A[by * 64, ko * 32], A_s)
                T.copy(B[ko * 32, bx * 64], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * 64, bx * 64])

    return kernel


def _ask(prog, queries):
    from tilecore_tvm.runtime import request

    reply = request({"op": "prove", "vars": prog.var_list, "queries": queries})
    assert reply.get("ok"), reply
    return reply["answers"]


def test_every_simplification_is_proven_equal_by_tvm(recorded):
    prog = _program()
    pairs = recorded["pairs"]
    assert recorded["lowered"] >= 300 and len(pairs) >= 1000, (recorded["lowered"], len(pairs))
    queries = [{"kind": "eq", "a": prog.expr(a), "b": prog.expr(b)} for a, b in pairs]
    answers = _ask(prog, queries)
    unbuilt = [pairs[k] for k, a in enumerate(answers) if a is None]
    unproven = [pairs[k] for k, a in enumerate(answers) if a is not None and not a[0]]
    print(f"\nsimplify(): {len(pairs)} rewrites over {recorded['lowered']} kernels; TVM proves "
          f"{len(pairs) - len(unbuilt) - len(unproven)} equal, {len(unproven)} not proven, {len(unbuilt)} not built")
    assert len(unbuilt) <= len(pairs) // 100, unbuilt[:5]
    assert not unproven, [(repr(a), repr(b)) for a, b in unproven[:10]]


def _holds(prog, recorded, ranges, known, cond, divs=None) -> dict:
    """The query "does ``cond`` hold under the prover's facts": each variable's range, each known form and
    each known divisibility (``divs``: ``x % k == 0``)."""
    from tilecore.ir import IntImm, binary, compare

    facts = []
    for vid, (lo, hi) in ranges.items():
        var = recorded["vars"].get(vid)
        if var is None:
            continue
        if lo is not None:
            facts.append(prog.expr(binary("sub", var, lo if not isinstance(lo, int) else IntImm(lo))))
        if hi is not None:
            facts.append(prog.expr(binary("sub", hi if not isinstance(hi, int) else IntImm(hi), var)))
    facts += [prog.expr(g) for g in known]
    conds = [prog.expr(compare("eq", binary("floormod", x, k), 0)) for x, k in (divs or {}).values()]
    return {"kind": "holds", "cond": prog.expr(cond), "facts": facts, "conds": conds}


def test_nothing_the_core_proves_is_refuted_by_tvm(recorded):
    prog = _program()
    queries, kept = [], []
    for ranges, known, cond, divs in recorded["proofs"]:
        queries.append(_holds(prog, recorded, ranges, known, cond, divs))
        kept.append(cond)
    assert len(queries) >= 1000, len(queries)
    answers = _ask(prog, queries)
    refuted = [repr(kept[k]) for k, a in enumerate(answers) if a is not None and a[1]]
    unbuilt = sum(a is None for a in answers)
    agreed = sum(bool(a and a[0]) for a in answers)
    print(f"\nbounds prover: {len(queries)} comparisons proven by the core; TVM also proves {agreed}, refutes "
          f"{len(refuted)}, {unbuilt} not built")
    assert unbuilt <= len(queries) // 100
    assert not refuted, refuted[:10]


def test_the_oracle_catches_a_wrong_simplification(recorded):
    """Mutations: an off-by-one result for a rewrite, and the negation of a comparison the core and TVM both
    prove, under the same facts; TVM must reject the first and refute the second (so the two tests above
    can fail), and accept the unmutated ones."""
    from tilecore.ir import Cmp, IntImm, binary

    prog = _program()
    a, b = next((a, b) for a, b in recorded["pairs"] if str(a.dtype) == "int32")
    cands = [p for p in recorded["proofs"][:300] if isinstance(p[2], Cmp)]
    answers = _ask(prog, [_holds(prog, recorded, *p) for p in cands])
    ranges, known, cond, _ = next(p for p, ans in zip(cands, answers) if ans and ans[0])
    neg = Cmp({"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}[cond.op], cond.a, cond.b)
    answers = _ask(prog, [{"kind": "eq", "a": prog.expr(a), "b": prog.expr(b)},
                          {"kind": "eq", "a": prog.expr(a), "b": prog.expr(binary("add", b, IntImm(1)))},
                          _holds(prog, recorded, ranges, known, cond),
                          _holds(prog, recorded, ranges, known, neg)])
    assert answers[0][0] is True and answers[1][0] is False
    assert answers[2] == [True, False] and answers[3][1] is True, (repr(cond), answers)


def _divides(e, d):
    from tilecore.ir import binary, compare

    return compare("eq", e, 0) if d == 0 else compare("eq", binary("floormod", e, d), 0)


def test_no_divisibility_the_core_claims_is_refuted_by_tvm(recorded):
    prog = _program()
    divs = recorded["divisions"]
    assert len(divs) >= 100, len(divs)
    queries = [_holds(prog, recorded, ranges, known, _divides(e, d), facts) for ranges, known, e, d, facts in divs]
    answers = _ask(prog, queries)
    refuted = [f"{divs[k][2]!r} % {divs[k][3]}" for k, a in enumerate(answers) if a is not None and a[1]]
    unbuilt = sum(a is None for a in answers)
    agreed = sum(bool(a and a[0]) for a in answers)
    print(f"\ndivisibility: {len(queries)} claims of the core (k divides e); TVM also proves {agreed}, refutes "
          f"{len(refuted)}, {unbuilt} not built")
    assert unbuilt <= len(queries) // 100
    assert not refuted, refuted[:10]


def test_the_oracle_catches_a_wrong_divisibility(recorded):
    """Mutation: ``e + 1`` claimed divisible by what divides ``e`` (``k >= 2``), under the same facts, for claims
    TVM proves; TVM must refute it (so the test above can fail), and accept the unmutated claim."""
    from tilecore.ir import binary

    prog = _program()
    cands = [c for c in recorded["divisions"] if c[3] >= 2][:200]
    answers = _ask(prog, [_holds(prog, recorded, r, kn, _divides(e, d), f) for r, kn, e, d, f in cands])
    picked = [c for c, a in zip(cands, answers) if a and a[0]][:20]
    assert picked, "TVM proves none of the core's divisibility claims"
    answers = _ask(prog, [_holds(prog, recorded, r, kn, _divides(binary("add", e, 1), d), f)
                          for r, kn, e, d, f in picked])
    assert all(a and a[1] for a in answers), [(repr(c[2]), c[3], a) for c, a in zip(picked, answers)]
