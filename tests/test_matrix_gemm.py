"""T.gemm on registered matrix units through the core model (tilecore.passes.matrix): the plan's
accumulator layout, and the per-thread program of lower_gemm, run by a small lockstep interpreter of the
IR in which a MatrixOp does what its unit's layouts say (the group's registers gathered into A, B and C
matrices by ``element(lane, reg)``, C += A B, scattered back). Checked for the CUDA mma.sync unit and for
the made-up 64-thread unit of tests/fake_matrix_backend.py, every transpose, several block shapes."""
from __future__ import annotations

import numpy as np
import pytest

from fake_matrix_backend import fake_unit
from tilecore.ir import (Allocate, BinOp, Buffer, BufferLoad, Cast, FloatImm, For, IntImm, MatrixLoad, MatrixOp, MatrixSync, Seq, Store,
                         ThreadIndex, TileOp, Var)
from tilecore.ir import collect, seq
from tilecore.passes import PassContext
from tilecore.passes.matrix import lower_gemm, plan_gemm

from tilecore_cuda.units import mma_16816_units, wgmma_units

UNITS = {"mma": mma_16816_units()[0], "fake": fake_unit()}


class Lockstep:
    """Runs a per-thread program on ``threads`` threads at once (every value an array over the threads)."""

    def __init__(self, threads, memory, units):
        self.t = threads
        self.mem = memory            # Buffer -> numpy array (shared memory)
        self.units = units           # spelling -> MatrixUnit
        self.env, self.regs = {}, {}
        self.syncs: list = []

    def ev(self, e):
        if isinstance(e, IntImm):
            return np.full(self.t, e.value, np.int64)
        if isinstance(e, FloatImm):
            return np.full(self.t, e.value)
        if isinstance(e, Var):
            return np.full(self.t, self.env[e], np.int64)
        if isinstance(e, ThreadIndex):
            return np.arange(self.t)
        if isinstance(e, Cast):
            return self.ev(e.value)
        if isinstance(e, BinOp):
            a, b = self.ev(e.a), self.ev(e.b)
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.floor_divide,
                    "floordiv": np.floor_divide, "floormod": np.mod}[e.op](a, b)
        if isinstance(e, BufferLoad):
            idx = tuple(self.ev(i) for i in e.indices)
            if e.buffer in self.regs:
                return self.regs[e.buffer][np.arange(self.t), idx[0]]
            return self.mem[e.buffer][idx]
        raise NotImplementedError(type(e).__name__)

    def run(self, s):
        if isinstance(s, list):
            for c in s:
                self.run(c)
        elif isinstance(s, Seq):
            for c in s.body:
                self.run(c)
        elif isinstance(s, Allocate):
            self.regs[s.buffer] = np.zeros((self.t, int(s.buffer.shape[0].value)))
        elif isinstance(s, For):
            assert s.kind in ("serial", "unroll")
            for v in range(s.start.value, s.start.value + s.extent.value):
                self.env[s.var] = v
                self.run(s.body)
        elif isinstance(s, Store):
            (i,) = (self.ev(x) for x in s.indices)
            assert (i == i[0]).all(), "register indices are constants"
            self.regs[s.buffer][:, i[0]] = self.ev(s.value)
        elif isinstance(s, MatrixLoad):
            self.run(s.fallback)  # the spelled forms are checked where they run (tests/cuda_host_emulator.py)
        elif isinstance(s, MatrixSync):
            self.syncs.append(s.phase)
        elif isinstance(s, MatrixOp):
            u = self.units[s.spelling]
            if u.attrs.get("async"):
                assert self.syncs[-1:] == ["begin"], "an asynchronous unit's instructions follow its begin"
            for g in range(self.t // u.group):
                mats = {}
                for role, buf, off in (("a", s.a, s.a_offset), ("b", s.b, s.b_offset), ("c", s.c, s.c_offset)):
                    lay = u.layouts()[role]
                    origin = getattr(s, f"{role}_origin", None)
                    if origin is not None:  # read from the shared tile by the instruction: the group's origin
                        s0, s1 = (self.ev(i)[g * u.group:(g + 1) * u.group] for i in origin.indices[-2:])
                        assert (s0 == s0[0]).all() and (s1 == s1[0]).all(), "one origin per group"
                        (p, q), tile = lay.shape, self.mem[origin.buffer]
                        trans = s.attrs[f"{role}_trans"]
                        mats[role] = tile[s0[0]:s0[0] + q, s1[0]:s1[0] + p].T if trans else tile[s0[0]:s0[0] + p, s1[0]:s1[0] + q]
                        assert mats[role].shape == (p, q)
                        continue
                    m = np.full(lay.shape, np.nan)
                    for lane in range(u.group):
                        for r in range(lay.regs):
                            m[lay.element(lane, r)] = self.regs[buf][g * u.group + lane, off + r]
                    mats[role] = m
                d = mats["c"] + mats["a"] @ mats["b"]
                for lane in range(u.group):
                    for r in range(u.c.regs):
                        self.regs[s.c][g * u.group + lane, s.c_offset + r] = d[u.c.element(lane, r)]
        else:
            raise NotImplementedError(type(s).__name__)


class Ctx(PassContext):
    def __init__(self, units):
        super().__init__(None, None, {}, matrix_units=list(units))


def gemm_op(m, n, k, ta, tb, dtype="float16", c_scope="fragment", clear=True):
    a = Buffer("A_s", (k, m) if ta else (m, k), dtype, "shared")
    b = Buffer("B_s", (n, k) if tb else (k, n), dtype, "shared")
    c = Buffer("C", (m, n), "float32", c_scope)
    return TileOp("gemm", (a.region(), b.region(), c.region()),
                  {"transpose_A": ta, "transpose_B": tb, "clear_accum": clear}), a, b, c


@pytest.mark.parametrize("unit", ["mma", "fake"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shape,threads", [((64, 64, 32), 128), ((32, 64, 16), 64), ((128, 32, 16), 256)])
def test_lowered_gemm_computes_the_product(unit, ta, tb, shape, threads):
    u = UNITS[unit]
    m, n, k = shape
    op, a, b, c = gemm_op(m, n, k, ta, tb)
    ctx = Ctx([u])
    plan = plan_gemm(op, threads, ctx)
    assert plan is not None, ctx.notes
    plan.c_layout.check()
    assert plan.c_layout.threads == threads and plan.c_layout.shape == (m, n)
    creg = Buffer("C_r", (plan.c_layout.regs,), "float32", "register")
    prog = lower_gemm(op, plan, {id(c): (creg, plan.c_layout)}, ctx)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal(a.static_shape()), rng.standard_normal(b.static_shape())
    sim = Lockstep(threads, {a: A, b: B}, {u.spelling: u})
    sim.regs[creg] = np.full((threads, plan.c_layout.regs), 7.0)    # clear_accum must zero it
    sim.run(prog)
    got = np.full((m, n), np.nan)
    for t in range(threads):
        for r in range(plan.c_layout.regs):
            got[plan.c_layout.element(t, r)] = sim.regs[creg][t, r]
    want = (A.T if ta else A) @ (B.T if tb else B)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_accumulates_without_clear():
    u = UNITS["fake"]
    op, a, b, c = gemm_op(32, 32, 16, False, False, clear=False)
    plan = plan_gemm(op, 128, Ctx([u]))
    creg = Buffer("C_r", (plan.c_layout.regs,), "float32", "register")
    prog = lower_gemm(op, plan, {id(c): (creg, plan.c_layout)}, Ctx([u]))
    A, B = np.ones((32, 16)), np.ones((16, 32))
    sim = Lockstep(128, {a: A, b: B}, {u.spelling: u})
    sim.regs[creg] = np.full((128, plan.c_layout.regs), 1.0)
    sim.run(prog)
    assert (sim.regs[creg] == 17.0).all()


def test_plan_tiles_groups_and_registers():
    op, *_ = gemm_op(128, 128, 32, False, False)
    plan = plan_gemm(op, 128, Ctx([UNITS["mma"]]))
    a_lay = plan.attrs.pop("a_layout")
    assert plan.attrs == {"unit": "mma_sync_m16n8k16", "groups": (2, 2), "atoms": (4, 8), "k_steps": 2}
    # A from registers: thread 37 (lane 5 of group 1: atom row 1) holds row 16 + 5 / 4, columns 2 (5 % 4) + 0, 1
    # in registers 0, 1; group 3 (atom row 1, atom column 1) holds the same rows (replicated over columns)
    assert a_lay.shape == (128, 32) and a_lay.regs == 8 * 4 * 2
    assert a_lay.element(37, 0) == (17, 2) and a_lay.element(37, 1) == (17, 3) and a_lay.element(101, 0) == (17, 2)
    assert plan.c_layout.regs == 4 * 4 * 8
    # thread 37 is lane 5 of warp 1 (atom row 1, atom column 0): its register 0 is row 16 + 5 / 4, column 2 (5 % 4)
    assert plan.c_layout.element(37, 0) == (16 + 1, 2)
    plan = plan_gemm(op, 128, Ctx([UNITS["fake"]]))
    assert plan.attrs["groups"] == (2, 1) and plan.attrs["atoms"] == (4, 8)


WGMMA = wgmma_units()


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shape,threads,unit", [((128, 128, 32), 128, "wgmma_m64n128k16"),
                                                ((128, 256, 64), 256, "wgmma_m64n256k16"),
                                                ((64, 64, 64), 128, "wgmma_m64n64k16")])
def test_wgmma_reads_its_shared_operands_at_the_right_origins(ta, tb, shape, threads, unit):
    """wgmma reads A and B from their tiles itself: the plan takes the largest instruction, lower_gemm gives
    each instruction the origin of its atom (transposed tiles too), brackets the k loop with the unit's
    MatrixSync and the lockstep run equals the product (MatrixUnit attrs: operand_sources, async)."""
    m, n, k = shape
    op, a, b, c = gemm_op(m, n, k, ta, tb)
    ctx = Ctx(mma_16816_units() + WGMMA)
    plan = plan_gemm(op, threads, ctx)
    assert plan.unit.spelling == unit and set(plan.attrs["shared"]) == {"a", "b"}
    creg = Buffer("C_r", (plan.c_layout.regs,), "float32", "register")
    prog = lower_gemm(op, plan, {id(c): (creg, plan.c_layout)}, ctx)
    assert [type(x).__name__ for x in prog][-3:] == ["MatrixSync", "For", "MatrixSync"]
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal(a.static_shape()), rng.standard_normal(b.static_shape())
    sim = Lockstep(threads, {a: A, b: B}, {u.spelling: u for u in WGMMA})
    sim.regs[creg] = np.full((threads, plan.c_layout.regs), 7.0)    # clear_accum must zero it
    sim.run(prog)
    assert sim.syncs == ["begin", "end"]
    got = np.full((m, n), np.nan)
    for t in range(threads):
        for r in range(plan.c_layout.regs):
            got[plan.c_layout.element(t, r)] = sim.regs[creg][t, r]
    np.testing.assert_allclose(got, (A.T if ta else A) @ (B.T if tb else B), rtol=1e-12, atol=1e-12)


def test_wgmma_refusals_say_why_and_mma_sync_runs_the_gemm():
    """B stored (K, N) with N contiguous needs the instruction's 24 columns (48 bytes) to be whole panels of
    128, 64 or 32 bytes: refused with the reason; mma.sync runs it. The same tile transposed (K contiguous:
    32-byte rows) is one 32-byte panel per row and is taken."""
    op, *_ = gemm_op(64, 24, 16, False, False)
    ctx = Ctx(WGMMA)
    assert plan_gemm(op, 128, ctx) is None
    assert "B_s's rows are 48 bytes and the instruction spans 48 of them" in ctx.notes[-1]
    assert plan_gemm(op, 128, Ctx(mma_16816_units() + WGMMA)).unit.spelling == "mma_sync_m16n8k16"
    op, *_ = gemm_op(64, 64, 16, False, True)
    assert plan_gemm(op, 128, Ctx(WGMMA)).attrs["shared"]["b"].swizzle_bytes == 32


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
@pytest.mark.parametrize("shape,threads,unit", [((128, 256, 128), 256, "wgmma_m64n256k32"),
                                                ((128, 128, 128), 256, "wgmma_m64n128k32"),
                                                ((64, 64, 64), 128, "wgmma_m64n64k32")])
def test_8_bit_wgmma_reads_both_operands_k_major_from_their_tiles(dtype, shape, threads, unit):
    """D67: an 8-bit gemm with B given as (N, K) (``transpose_B``) plans onto wgmma's m64nNk32 with A and B read
    from their shared tiles (no operand copied per thread: no register operand, no MatrixLoad), K-major panels of
    the widest swizzle its 8-bit rows fill, four instructions' k per 128 columns; the lockstep run equals the
    product."""
    m, n, k = shape
    op, a, b, c = gemm_op(m, n, k, False, True, dtype=dtype)
    ctx = Ctx(mma_16816_units() + WGMMA)
    plan = plan_gemm(op, threads, ctx)
    assert plan is not None, ctx.notes
    assert plan.unit.spelling == unit and plan.attrs["k_steps"] == k // 32 and set(plan.attrs["shared"]) == {"a", "b"}
    assert {x: (lay.swizzle_bytes, lay.panels) for x, lay in plan.attrs["shared"].items()} == \
        {"a": (min(128, k), True), "b": (min(128, k), True)}
    creg = Buffer("C_r", (plan.c_layout.regs,), "float32", "register")
    prog = lower_gemm(op, plan, {id(c): (creg, plan.c_layout)}, ctx)
    assert not collect(seq(prog), MatrixLoad) and not [x for x in prog if isinstance(x, Allocate)], \
        "no operand copied into registers"
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal(a.static_shape()), rng.standard_normal(b.static_shape())
    sim = Lockstep(threads, {a: A, b: B}, {u.spelling: u for u in WGMMA})
    sim.regs[creg] = np.full((threads, plan.c_layout.regs), 7.0)
    sim.run(prog)
    got = np.full((m, n), np.nan)
    for t in range(threads):
        for r in range(plan.c_layout.regs):
            got[plan.c_layout.element(t, r)] = sim.regs[creg][t, r]
    np.testing.assert_allclose(got, A @ B.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ta,tb,x", [(False, False, "B"), (True, True, "A"), (True, False, "A")])
def test_8_bit_wgmma_refuses_an_mn_major_operand_and_says_why(ta, tb, x):
    """wgmma has no transpose for 8-bit operands (the unit's ``k_major_only``): A stored (K, M) or B stored (K, N)
    is refused with the reason; the 16-bit unit takes the same layouts."""
    op, *_ = gemm_op(128, 128, 64, ta, tb, dtype="float8_e4m3")
    ctx = Ctx(WGMMA)
    assert plan_gemm(op, 128, ctx) is None
    assert f"reads {x} with K contiguous only" in ctx.notes[-1], ctx.notes
    op, *_ = gemm_op(128, 128, 64, ta, tb)
    assert plan_gemm(op, 128, Ctx(WGMMA)).unit.spelling == "wgmma_m64n128k16"


@pytest.mark.parametrize("policy,groups", [(None, (2, 2)), ("1", (4, 1)), ("GemmWarpPolicy.FullRow", (4, 1)),
                                           ("2", (2, 2))])
def test_plan_honours_the_warp_policy(policy, groups):
    """T.GemmWarpPolicy.FullRow puts every group down the rows (whole rows per group: what an A operand
    taken from the previous gemm's accumulator needs); otherwise the squarest (FullCol too: groups across
    the columns would split every row reduction between groups)."""
    op, *_ = gemm_op(128, 128, 32, False, False)
    op.attrs["policy"] = policy
    assert plan_gemm(op, 128, Ctx([UNITS["mma"]])).attrs["groups"] == groups


@pytest.mark.parametrize("args,why", [
    (dict(m=24, n=64, k=32, ta=False, tb=False), "multiples of 16, 8, 16"),
    (dict(m=64, n=64, k=32, ta=False, tb=False, dtype="float32"), "multiplies float16/bfloat16 into float32"),
    (dict(m=64, n=64, k=32, ta=False, tb=False, c_scope="shared"), "whole 2-D fragment"),
])
def test_refusals_say_why(args, why):
    op, *_ = gemm_op(**args)
    ctx = Ctx([UNITS["mma"]])
    assert plan_gemm(op, 128, ctx) is None
    assert why in ctx.notes[-1] and ctx.notes[-1].startswith("tilecore.matrix: gemm into C")


def test_groups_that_do_not_divide_are_refused():
    op, *_ = gemm_op(16, 16, 8, False, False)
    ctx = Ctx([UNITS["fake"]])
    assert plan_gemm(op, 96, ctx) is None and "groups of 64 threads, the block has 96" in ctx.notes[-1]
    assert plan_gemm(op, 128, ctx) is None and "2 groups of 64 threads do not divide 1x1 atoms" in ctx.notes[-1]


def test_pass_config_false_keeps_gemm_off_the_units():
    op, *_ = gemm_op(64, 64, 32, False, False)
    ctx = Ctx([UNITS["mma"]])
    ctx.config["tilecore.matrix_unit_gemm"] = False
    assert plan_gemm(op, 128, ctx) is None and "tilecore.matrix_unit_gemm is False" in ctx.notes[-1]
    plan_gemm(op, 128, ctx)
    assert len(ctx.notes) == 1     # asked again (the layout pass settles in rounds): noted once
