"""Dynamic-shape GEMMs on bulk tile copies (TMA): a pipelined loop whose copies lack only a launch-time fact
(a tensor's row length, a shape symbol, a whole number of 16-byte units; its sizes positive) is compiled
twice under one test of that condition (docs/decisions.md D40): bulk copies on transaction barriers where it
holds, the per-thread cp.async copies otherwise. The CUDA runtime evaluates the same condition (each tensor
map's ``when``) and encodes the tensor maps only where it holds, passing zeros in their place otherwise.

Compile-only wherever a CUDA compiler exists (CI): the plan's note, both versions in the SASS (UTMALDG and
LDGSTS), no serialized wgmma, the bulk branch meeting at no block barrier before its gemm, the condition the
host evaluates equal to the kernel's own test (with a mutated kernel that disagrees caught). With a recording
driver (no GPU): which descriptors each launch encodes, through the Python binder and the compiled launcher
alike. On an sm_90 GPU: float64 references for aligned, misaligned (odd K, N), ragged and tiny shapes, and
which version ran.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

tilecore_cuda = pytest.importorskip("tilecore_cuda")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, hopper_gpu  # noqa: E402



def dynamic_gemm(bm=128, bn=128, bk=32, threads=256, stages=3, dtype="float16", mn=None):
    """The TileLang dynamic-shape GEMM (M, N, K all ``T.dynamic``; float32 C), as the catalog has it
    (``mn``: M and N static, K alone dynamic)."""
    M, N, K = T.dynamic("M"), T.dynamic("N"), T.dynamic("K")
    if mn is not None:
        M, N = mn

    @T.prim_func
    def gemm_dyn(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return gemm_dyn


_compiled: dict = {}


def _kernel(mn=None, **options):
    key = (mn,) + tuple(sorted(options.items()))
    if key not in _compiled:
        _compiled[key] = tilecore.compile(dynamic_gemm(mn=mn), target=HOPPER, pass_configs={**NOCACHE, **options})
    return _compiled[key]


def _note(k) -> str:
    return " ".join(k.meta["attrs"]["pipelines"])


# -- compile-only ------------------------------------------------------------------------------------

@needs_toolchain
def test_the_loop_is_versioned_on_the_row_lengths_and_both_versions_reach_the_sass():
    k = _kernel()
    note = _note(k)
    assert "A_s bulk tile copies" in note and "B_s bulk tile copies" in note
    assert "versioned at launch: where" in note and "(K % 8) == 0" in note and "(N % 8) == 0" in note
    assert "async 16-byte copies where K % 8 == 0" in note  # the other branch keeps D20's copies
    maps = k.meta["source"]["meta"]["tensor_maps"]
    assert len(maps) == 2 and all(m.get("when") for m in maps)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    assert "UTMALDG" in sass and "LDGSTS" in sass and "HGMMA" in sass and "SYNCS" in sass
    # the loop and its drain stay under their trip-count tests in both branches: no serialized wgmma
    assert not k.meta["source"]["meta"].get("performance_notes")


@needs_toolchain
def test_no_accumulator_is_stored_before_a_wgmma_wait_in_either_branch():
    """D29's ptxas hazard, per branch: after each group of HGMMA (both versions' loops, unrolled) the SASS waits
    (WARPGROUP.DEPBAR 0) before it stores anything."""
    k = _kernel()
    lines = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target).splitlines()
    gmma = [i for i, ln in enumerate(lines) if "HGMMA" in ln]
    ends = [a for a, b in zip(gmma, gmma[1:] + [len(lines)]) if b - a > 60]
    assert len(ends) >= 2  # one group per version at least
    for end in ends:
        wait = next(i for i in range(end, len(lines)) if "DEPBAR.LE gsb0, 0x0" in lines[i])
        assert not [ln for ln in lines[end:wait] if "STG" in ln or "F2FP" in ln]


@needs_toolchain
def test_the_bulk_branch_meets_at_no_block_barrier_before_its_gemm():
    """The tiles are written by bulk copies in one branch and by cp.async in the other: within the bulk
    branch every thread waits on the stage's barrier itself (as a static kernel's loop does), so its loop
    has one block barrier (before the stage ahead is issued) and the cp.async loop two."""
    src = _kernel().get_kernel_source()
    body = src[src.index("__global__"):]
    loops = re.findall(r"for \(long long ko = 0;.*?\n      \}\n", body, re.S)
    assert len(loops) == 2
    bulk, per_thread = sorted(loops, key=lambda x: "tc_mbar_wait" not in x)
    assert "tc_mbar_wait" in bulk and "tc_tma_load_2d" in bulk and "tc_cp_async" not in bulk
    assert bulk.count("__syncthreads()") == 1 and "tc_wg_fence_proxy" not in bulk
    assert "tc_cp_async_wait" in per_thread and per_thread.count("__syncthreads()") >= 2


@needs_toolchain
@pytest.mark.parametrize("mn, option, why", [
    (None, {"tilecore.bulk_copy_versioned": False}, "tilecore.bulk_copy_versioned is off"),
    (None, {"tilecore.warp_specialize": True}, "warp specialization was asked"),
    # (the loads' tensor maps: without D51's default bulk store, whose map is C's)
    ((4096, 4096), {"tilecore.persistent": 132, "tilecore.bulk_store": False},
     "the loop is carried across a persistent tile loop"),
])
def test_without_versioning_the_loop_keeps_per_thread_copies_and_says_why(mn, option, why):
    k = _kernel(mn, **option)
    note = _note(k)
    assert "bulk tile copies" not in note and f"not versioned at launch: {why}" in note
    assert not k.meta["source"]["meta"]["tensor_maps"]
    assert "UTMALDG" not in tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)


def _version_test(source: str) -> str:
    """The kernel's launch-time test, as written in its source (the ``if`` that opens the bulk branch)."""
    body = source[source.index("__global__"):]
    return next(line.strip()[len("if ("):-len(") {")] for line in body.splitlines()
                if line.strip().startswith("if (") and "tc_floormod(K, " in line and "> 0" in line)


def _evaluate_c(cond: str, M: int, N: int, K: int) -> bool:
    py = cond.replace("&&", " and ").replace("||", " or ").replace("tc_floormod", "_fm")
    return bool(eval(py, {"_fm": lambda a, b: a % b, "M": M, "N": N, "K": K}))  # noqa: S307


SHAPES = [(M, N, K) for M in (0, 1, 128) for N in (0, 8, 100, 136) for K in (0, 7, 8, 255, 256)]


def disagreements(source: str, meta: dict, signature: dict, shapes=SHAPES) -> list:
    """The shapes at which the host would encode a tensor map the kernel's own test says it does not read,
    or not encode one it does."""
    from tilecore.runtime.launch import shape_fn

    cond = _version_test(source)
    out = []
    for M, N, K in shapes:
        values = {"M": M, "N": N, "K": K}
        ints = [values[n] for n in signature["ints"]]
        kernel = _evaluate_c(cond, M, N, K)
        out += [(M, N, K) for m in meta["tensor_maps"] if bool(shape_fn([m["when"]])(ints)[0]) != kernel]
    return out


@needs_toolchain
def test_the_host_evaluates_the_kernels_own_test():
    k = _kernel()
    src, meta, sig = k.get_kernel_source(), k.meta["source"]["meta"], k.meta["signature"]
    assert sorted(sig["ints"]) == ["K", "M", "N"]
    assert disagreements(src, meta, sig) == []
    assert _evaluate_c(_version_test(src), 128, 136, 256) and not _evaluate_c(_version_test(src), 128, 136, 255)
    # mutations of the kernel's test: 8-byte units (disagrees at K = 4 mod 8), K = 0 let through
    assert disagreements(src.replace("tc_floormod(K, 8)", "tc_floormod(K, 4)"), meta, sig, SHAPES + [(128, 136, 12)])
    assert disagreements(src.replace("(K > 0)", "(K >= 0)"), meta, sig)


def test_host_expressions_spell_conditions_as_0_or_1():
    """Plugin API 1.8: ``host_expr`` writes comparisons and and/or/not (a versioned loop's launch test)."""
    from tilecore.codegen import host_expr
    from tilecore.ir import Var, binary, compare, logic_and, logic_not, logic_or
    from tilecore.runtime.launch import shape_fn

    k, n = Var("K", "int32"), Var("N", "int32")
    cond = logic_or(logic_and(compare("eq", binary("floormod", k, 8), 0), compare("gt", k, 0)),
                    logic_not(compare("le", n, 3)))
    fn = shape_fn([host_expr(cond, [k, n])])
    got = {(kv, nv): fn([kv, nv])[0] for kv in (-8, 0, 7, 8, 16) for nv in (3, 4)}
    assert got == {(kv, nv): int((kv % 8 == 0 and kv > 0) or not nv <= 3) for kv, nv in got}


# -- the launch, with a recording driver (no GPU) ----------------------------------------------------

@needs_toolchain
@pytest.mark.parametrize("c_launcher", [True, False])
def test_descriptors_are_encoded_only_where_the_launch_takes_the_bulk_version(c_launcher, monkeypatch):
    from test_c_launcher import on_cpu

    kernel = _kernel()
    k, prog, driver = on_cpu(kernel, c_launcher, monkeypatch)
    names = kernel.meta["signature"]["ints"]
    first = 3 + len(names)  # A, B, C, the integers, then the two descriptors
    cases = [((256, 136, 264), True), ((256, 136, 255), False), ((256, 100, 256), False), ((3, 8, 8), True),
             ((64, 64, 0), False)]
    for (M, N, K), bulk in cases:
        a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
        c = torch.empty(M, N, dtype=torch.float32)
        n = len(driver.records)
        k(a, b, c)
        assert len(driver.records) == n + 1, (M, N, K)
        words = [int.from_bytes(p, "little") for p in driver.records[-1]["params"]]
        values = dict(zip(names, words[3:first]))
        assert values == {"M": M, "N": N, "K": K}
        if bulk:  # the recorder's descriptor: the address, the outermost size in the top 16 bits
            assert words[first:first + 2] == [a.data_ptr() ^ (M << 48), b.data_ptr() ^ (K << 48)], (M, N, K)
        else:
            assert words[first:first + 2] == [0, 0], (M, N, K)
        assert words[-1] == prog._status_ptr
    assert (k._native is not None) == c_launcher
    # the same addresses with other shapes (views): new integers, so the last launch's descriptors are not reused
    a, b = torch.randn(256, 264).half(), torch.randn(264, 136).half()
    c = torch.empty(256, 136, dtype=torch.float32)
    k(a, b, c)
    assert [int.from_bytes(p, "little") for p in driver.records[-1]["params"][first:first + 2]] == \
        [a.data_ptr() ^ (256 << 48), b.data_ptr() ^ (264 << 48)]
    k(a.view(128, 528), b.view(528, 68), c.view(-1)[:128 * 68].view(128, 68))  # N = 68: the cp.async version
    assert [int.from_bytes(p, "little") for p in driver.records[-1]["params"][first:first + 2]] == [0, 0]
    k(a.view(128, 528), b.view(528, 68)[:, :64].contiguous(), c.view(-1)[:128 * 64].view(128, 64))
    assert [int.from_bytes(p, "little") for p in driver.records[-1]["params"][first:first + 2]][0] == \
        a.data_ptr() ^ (128 << 48)
    # the zeros are cached beside the encoded maps (one lookup per launch); a launch again adds nothing
    from tilecore_cuda.runtime import _UNUSED_MAP

    cached = len(prog.tmap_cache)
    assert any(v is _UNUSED_MAP for v in prog.tmap_cache.values())
    n = len(driver.records)
    k(a.view(128, 528), b.view(528, 68), c.view(-1)[:128 * 68].view(128, 68))
    assert len(prog.tmap_cache) == cached and driver.records[-1]["params"] == driver.records[n - 2]["params"]


@needs_toolchain
def test_a_map_whose_test_is_forced_true_fails_loudly(monkeypatch):
    """Mutation of the runtime's choice: told to encode where the rows are not whole 16-byte units, the
    launch refuses (it never passes a descriptor the driver would reject, or a kernel would misread)."""
    from test_c_launcher import on_cpu

    from tilecore.errors import DeviceError

    k, prog, driver = on_cpu(_kernel(), False, monkeypatch)
    for m in prog.tmaps:
        m["when"] = lambda ints: (1,)
    a, b, c = torch.randn(64, 255).half(), torch.randn(255, 64).half(), torch.empty(64, 64)
    with pytest.raises(DeviceError, match="rows are multiples of 16 bytes.*bulk_copy_versioned"):
        k(a, b, c)


@needs_toolchain
@pytest.mark.parametrize("c_launcher", [True, False])
def test_an_operand_off_a_16_byte_boundary_is_refused_by_both_versions(c_launcher, monkeypatch):
    """The base address is no launch-time choice: both versions need A and B 16-byte aligned (the bulk copies'
    tensor maps, the cp.async version's 16-byte copies where K % 8 == 0), and the launch says so."""
    from test_c_launcher import on_cpu

    from tilecore.errors import DeviceError

    k, prog, driver = on_cpu(_kernel(), c_launcher, monkeypatch)
    for K in (64, 63):
        a = torch.empty(64 * K + 1, dtype=torch.float16)[1:].view(64, K)
        b, c = torch.randn(K, 64).half(), torch.empty(64, 64)
        n = len(driver.records)
        with pytest.raises(DeviceError, match="argument 0: .*16-byte aligned"):
            k(a, b, c)
        assert len(driver.records) == n
        k(a.clone(), b, c)  # a fresh tensor launches
        assert len(driver.records) == n + 1


# -- on an sm_90 GPU -------------------------------------------------------------------------------

DEVICE_SHAPES = [
    ((256, 512, 384), True),    # aligned, whole tiles
    ((200, 136, 264), True),    # aligned rows, ragged M, N and K: the bulk copies' out-of-tensor zeros
    ((129, 200, 255), False),   # odd K: cp.async, element copies of A
    ((64, 100, 64), False),     # N a multiple of 4, not 8: cp.async, narrow copies of B
    ((1, 8, 8), True),          # tiny, one partial tile
    ((3, 5, 7), False),         # tiny and odd
    ((17, 24, 0), False),       # K = 0: C is zero
]


def _encoded(k) -> int:
    """Tensor maps the kernel's program has encoded (and cached) so far."""
    from tilecore_cuda.runtime import _UNUSED_MAP

    prog = getattr(k, "_program", None)
    return 0 if prog is None else sum(v is not _UNUSED_MAP for v in prog.tmap_cache.values())


@hopper_gpu
@pytest.mark.parametrize("c_launcher", ["1", "0"])
def test_dynamic_gemm_matches_float64_on_both_versions(c_launcher, monkeypatch):
    monkeypatch.setenv("TILECORE_C_LAUNCHER", c_launcher)
    k = tilecore.compile(dynamic_gemm(), target="cuda", pass_configs=NOCACHE)
    rng = np.random.default_rng(7)
    for (M, N, K), bulk in DEVICE_SHAPES:
        a = rng.standard_normal((M, K)).astype(np.float16)
        b = rng.standard_normal((K, N)).astype(np.float16)
        c = torch.full((M, N), float("nan"), device="cuda")
        before = _encoded(k)
        k(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        got = c.cpu().numpy().astype(np.float64)
        assert np.abs(got - ref).max(initial=0.0) <= 1e-2 * max(1.0, np.abs(ref).max(initial=0.0)), (M, N, K)
        encoded = _encoded(k) - before
        assert (encoded == 2) == bulk, ((M, N, K), encoded)
