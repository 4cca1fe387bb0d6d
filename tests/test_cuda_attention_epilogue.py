"""FA3's epilogue and order in the register programs (docs/decisions.md D45), through the public API:
``tilecore.cuda.attention_tma_store`` (off until the H100 measures it) writes the output tile (FlashAttention's O)
through shared memory and TMA stores instead of each thread storing its fragment: each consumer warpgroup writes
its 64 rows with ``stmatrix`` into its own rows of the tile loaded once that only the gemms read as A (Q: free
after the consumer's last ``S = Q K^T``), fences them to the async proxy, syncs its 128 threads on a named
barrier, and one thread stores the 64 x 64 boxes (the tensor map clips rows past the sequence). Same rounding as
the direct stores (``__floats2half2_rn``): the same bits.

``tilecore.cuda.rescale_under_qk`` (off until measured): with the intra-warpgroup overlap, O's rescale (``O = O * r``,
between the two gemms) runs in the next iteration after its S = Q K^T is issued and before the P @ V it feeds
(FA3's order): under the tensor cores' work, off the softmax's path to the next turn; the same operations on O in the
same order (the same bits).

Without a GPU (CI): the notes, the fallbacks, the SASS (8 STSM and 2 UTMASTG for d128, the main loop's count
unchanged, no local memory), and the layout: the generated stmatrix addresses and TMA store coordinates are
evaluated for every lane of every warp and consumer, stmatrix's and the 128-byte swizzle's semantics applied,
and every accumulator register must land on its own (row, column) of the output (two mutations caught: the
swizzle's XOR dropped, two matrices swapped). On an sm_90 GPU: bit for bit against the direct stores, exact and
fast math, ragged sequences, causal, three consumers at d64, and float64 references. The rescale's move: the
64 FMUL inside the turn in the SASS, the loop's count unchanged, and the host simulator's protocols (WGMMA
hazards, stage releases, turns, every register array's history as with the option off) for 0-5 trips and every
split count, with a mutation caught; on the GPU bit for bit against the defaults.
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _attention, _notes, hopper_gpu, torch_cuda  # noqa: E402,F401

TMA = {"tilecore.cuda.attention_tma_store": True}
DIRECT = {"tilecore.cuda.attention_tma_store": False}

#: (seq, dim, bm, bn, threads, causal)
SHAPES = {"128": (1024, 128, 128, 128, 256, False), "128-causal": (1024, 128, 128, 128, 256, True),
          "176-ragged": (1000, 128, 128, 176, 256, False), "176-causal-ragged": (1000, 128, 128, 176, 256, True),
          "d64-3": (1000, 64, 192, 64, 384, True),
          # whole K/V blocks, not causal: the masked loop in one part (O's rescale under S applies)
          "176-whole": (1056, 128, 128, 176, 256, False), "d64-3-whole": (1152, 64, 192, 64, 384, False)}


@functools.lru_cache(maxsize=None)
def _bench(tma: bool, fast: bool = True, bn: int = 128):
    """The benchmark's kernel (b8 h32 s4096 d128, 128 x bn, 256 threads, 2 stages, non-causal), compiled only."""
    return tilecore.compile(_attention(4096, 128, 128, bn, 256, False, heads=32, batch=8), target=HOPPER,
                            pass_configs={**NOCACHE, **(TMA if tma else DIRECT), "tilecore.fast_math": fast})


@needs_toolchain
def test_default_on_and_the_note():
    from tilecore_cuda import _tmastore

    assert _tmastore.ATTENTION_TMA_STORE_DEFAULT is True
    off, on = _bench(False), _bench(True)
    default = tilecore.compile(_attention(4096, 128, 128, 128, 256, False, heads=32, batch=8), target=HOPPER,
                               pass_configs={**NOCACHE, "tilecore.fast_math": True})
    assert default.get_kernel_source() == on.get_kernel_source()
    assert "tc_tma_store_4d(&" not in off.get_kernel_source() and "TMA store" not in _notes(off)
    assert "acc_o stored through shared memory (Q_s's rows of each consumer" in _notes(on)
    src = on.get_kernel_source()
    assert src.count("tc_tma_store_4d(&") == 2 and "tc_rp_wg_sync(8 + tc_c)" in src
    assert "tc_store2<__half>(tc_p" not in src.split("__global__")[-1]  # the direct stores are gone


@needs_toolchain
@pytest.mark.parametrize("bn,fast", [(128, True), (176, False)])
def test_sass_stmatrix_and_tma_stores_loop_unchanged(bn, fast):
    dis = tilecore_cuda.CUDABackend().disassemble
    on, off = dis(_bench(True, fast, bn).binary, HOPPER), dis(_bench(False, fast, bn).binary, HOPPER)
    assert on.count("STSM.16.M88.4") == 8 and on.count("UTMASTG.4D") == 2  # 128 columns: 8 x4 matrices a thread
    assert "STSM" not in off and "UTMASTG" not in off
    assert "STL" not in on and "LDL" not in on
    # the epilogue leaves the main loop alone
    count = lambda s: [sum(c.values()) for _, c in sass_paths.paths(sass_paths.parse(s), sass_paths.main_loop(  # noqa: E731
        sass_paths.parse(s)))]
    assert count(on) == count(off)
    # the direct stores: 32 pairs of 16-bit values a thread (STG.E), gone from the epilogue
    assert len(re.findall(r"STG\.E ", off)) == 32 and len(re.findall(r"STG\.E ", on)) == 0


@needs_toolchain
def test_fallbacks_say_why():
    # the mma.sync path (sm_80) has no TMA
    k = tilecore.compile(_attention(256, 64, 64, 64, 128, False), target="cuda:sm_80", pass_configs={**NOCACHE, **TMA})
    assert "no TMA store epilogue (no TMA on the mma.sync path); direct stores from registers" in _notes(k)
    # a float32 output
    from tilecore_conformance.composite import flash_attention_forward  # noqa: F401

    import tilecore.language as T

    @T.prim_func
    def f32_out(Q: T.Tensor((1024, 128), "float16"), K: T.Tensor((1024, 128), "float16"),
                O: T.Tensor((1024, 128), "float32")):
        with T.Kernel(8, threads=256) as bx:
            Q_s = T.alloc_shared((128, 128), "float16")
            K_s = T.alloc_shared((128, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.copy(Q[bx * 128, 0], Q_s)
            T.fill(acc, 0)
            for k in T.Pipelined(8, num_stages=2):
                T.copy(K[k * 128, 0], K_s)
                T.gemm(Q_s, K_s, acc, transpose_B=True)
            T.copy(acc, O[bx * 128, 0])

    k = tilecore.compile(f32_out, target=HOPPER, pass_configs={**NOCACHE, **TMA})
    assert "no TMA store epilogue (O is float32" in _notes(k)
    assert "tc_tma_store_4d(&" not in k.get_kernel_source()


# -- the layout, from the generated code ------------------------------------------------------------------------

def _c_eval(expr: str, env: dict) -> int:
    """A C integer expression of the generated code (non-negative operands) in Python."""
    e = re.sub(r"\(unsigned\)|\(int\)", "", expr)
    e = re.sub(r"(\d+)u\b", r"\1", e).replace("/", "//")
    return int(eval(e, {}, env))  # noqa: S307 - our own generated text


def _layout_problems(src: str, nc: int, n: int) -> list:
    """Runs the epilogue's stmatrix addresses and TMA stores for every consumer, warp and lane: the output
    coordinate (row within the block, column) of each accumulator register, checked against the WGMMA layout
    (register 4 j + 2 h + e of lane l in warp w of consumer c is row 64 c + 16 w + l / 4 + 8 h, column
    8 j + 2 (l % 4) + e)."""
    body = src.split("const unsigned tc_o = ")[1]
    tc_o = body.split(";")[0]
    loop = re.search(r"for \(int tc_j = 0; tc_j < (\d+); tc_j \+= 2\)", body)
    m_line = re.search(r"const int tc_m = ([^,]+), tc_jj = ([^;]+);", body)
    rr = re.search(r"const int tc_rr = ([^;]+);", body).group(1)
    call = re.search(r"tc_rp_stmatrix_x4\((.*?)\);", body, re.S).group(1)
    addr, *regs = [x.strip() for x in re.split(r",\s*(?=tc_pack|\n)", call.replace("\n", " ")) if x.strip()]
    regs = [re.findall(r"\[([^\]]+)\]", r) for r in regs]  # [[lo index, hi index]] per matrix
    stores = re.findall(r"tc_tma_store_(\d)d\(&\w+, tc_o \+ (\d+)u, (.*?)\);", body)
    assert int(loop.group(1)) == n // 8 and len(regs) == 4 and stores
    problems, seen = [], {}
    for c in range(nc):
        base = _c_eval(tc_o, {"tc_base": 0, "tc_c": c})
        boxes = []
        for _, off, coords in stores:
            parts = [x.strip() for x in coords.split(", ")]
            env = {"bx": 0, "by": 0, "bz": 0, "tc_c": c}  # coordinates relative to the block's first
            rows = [_c_eval(p, env) for p in parts[1:] if "tc_c" in p]
            assert len(rows) == 1, parts
            boxes.append((base + int(off), _c_eval(parts[0], env), rows[0]))
        smem = {}
        for w in range(4):
            for j in range(0, n // 8, 2):
                addrs = {}
                for lane in range(32):
                    env = {"tc_l": lane, "tc_t": 32 * w + lane, "tc_j": j, "tc_o": base, "tc_c": c}
                    env["tc_m"] = _c_eval(m_line.group(1), env)
                    env["tc_jj"] = _c_eval(m_line.group(2), env)
                    env["tc_rr"] = _c_eval(rr, env)
                    addrs[lane] = _c_eval(addr, env)
                for mat in range(4):  # stmatrix: row r of matrix K at lane 8 K + r's address, element
                    for r in range(8):  # (r, 2 q + e) from lane 4 r + q's register K, half e
                        for q in range(4):
                            lane = 4 * r + q
                            for e in range(2):
                                idx = _c_eval(regs[mat][e], {"tc_j": j})
                                smem[addrs[8 * mat + r] + 2 * (2 * q + e)] = (c, w, lane, idx)
        for at, (c_, w, lane, idx) in smem.items():
            hit = [(s, col0, row0) for s, col0, row0 in boxes if s <= at < s + 64 * 128]
            if len(hit) != 1:
                problems.append(f"consumer {c}: byte {at - base} in {len(hit)} boxes")
                continue
            s, col0, row0 = hit[0]
            o = at - s
            row, chunk = o // 128, (o % 128) // 16
            col = col0 + ((chunk ^ (row % 8)) * 8) + (o % 16) // 2  # the 128-byte swizzle, undone
            j, h, e = idx // 4, (idx % 4) // 2, idx % 2
            want = (64 * c_ + 16 * w + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + e)
            if (row0 + row, col) != want:
                problems.append(f"consumer {c_} warp {w} lane {lane} register {idx}: stored at {(row0 + row, col)}, "
                                f"belongs at {want}")
            seen[want] = seen.get(want, 0) + 1
    missing = nc * 64 * n - len(seen)
    if missing or any(v != 1 for v in seen.values()):
        problems.append(f"{missing} output elements never written, {sum(v > 1 for v in seen.values())} twice")
    return problems


@needs_toolchain
@pytest.mark.parametrize("shape", ["128", "d64-3"])
def test_layout_every_register_lands_on_its_element(shape):
    seq, dim, bm, bn, threads, causal = SHAPES[shape]
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target=HOPPER, pass_configs={**NOCACHE, **TMA})
    src = k.get_kernel_source()
    assert _layout_problems(src, bm // 64, dim) == []
    # mutations: the swizzle's XOR dropped; two matrices of the x4 swapped
    bad = src.replace("((tc_jj % 8) ^ (tc_rr % 8))", "(tc_jj % 8)")
    assert bad != src and any("belongs at" in p for p in _layout_problems(bad, bm // 64, dim))
    bad = src.replace("tc_pack_h2(acc_o[4 * tc_j], acc_o[4 * tc_j + 1]), tc_pack_h2(acc_o[4 * tc_j + 2], "
                      "acc_o[4 * tc_j + 3])", "tc_pack_h2(acc_o[4 * tc_j + 2], acc_o[4 * tc_j + 3]), "
                      "tc_pack_h2(acc_o[4 * tc_j], acc_o[4 * tc_j + 1])")
    assert bad != src and any("belongs at" in p for p in _layout_problems(bad, bm // 64, dim))


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------------

def _device_run(torch, shape, configs, fast=False):
    seq, dim, bm, bn, threads, causal = SHAPES[shape]
    rng = np.random.default_rng(17)
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float16) for _ in range(3))
    q[1] *= 4
    qt, kt, vt = (torch.from_numpy(x).cuda() for x in (q, kk, v))
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal), target="cuda",
                         pass_configs={**configs, "tilecore.fast_math": fast})
    o = torch.full_like(qt, 7.0)
    k(qt, kt, vt, o)
    torch.cuda.synchronize()
    return (q, kk, v), o.double().cpu().numpy(), k


@hopper_gpu
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("shape", list(SHAPES)[:5])
def test_device_tma_store_bit_identical_and_float64(torch_cuda, shape, fast):
    from tilecore_conformance.composite import attention_ref

    inputs, got, k = _device_run(torch_cuda, shape, TMA, fast)
    assert "stored through shared memory" in _notes(k)
    _, base, _ = _device_run(torch_cuda, shape, DIRECT, fast)
    assert got.tobytes() == base.tobytes()
    seq, dim, *_, causal = SHAPES[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)


@hopper_gpu
def test_device_tma_store_with_every_schedule(torch_cuda):
    from tilecore_conformance.composite import attention_ref

    for sched in ({"tilecore.cuda.pingpong": False}, {"tilecore.cuda.intra_wg_overlap": False},
                  {"tilecore.cuda.softmax_beside_pv": True}, {"tilecore.cuda.rescale_under_qk": True}):
        inputs, got, _ = _device_run(torch_cuda, "128-causal", {**TMA, **sched}, False)
        _, base, _ = _device_run(torch_cuda, "128-causal", {**DIRECT, **sched}, False)
        assert got.tobytes() == base.tobytes(), sched
        ref = attention_ref(inputs, "float16", True, seq=1024, dim=128)[0]
        np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)


# -- O's rescale under the next S = Q K^T -------------------------------------------------------------------------

LATE = {"tilecore.cuda.rescale_under_qk": True}


def _fmul_in_turn(sass: str) -> int:
    """FMUL between the loop's turn (BAR.SYNC) and the pass of it (BAR.ARV)."""
    ins = sass_paths.parse(sass)
    loop = [ins[k][1] for k in sass_paths.main_loop(ins)]
    a = next(n for n, t in enumerate(loop) if "BAR.SYNC" in t)
    b = next(n for n, t in enumerate(loop) if "BAR.ARV" in t)
    return sum(sass_paths.opcode(t) == "FMUL" for t in loop[a:b])


@needs_toolchain
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "exact"])
def test_rescale_under_qk_sass(fast):
    from tilecore_cuda import regprog

    assert regprog.RESCALE_UNDER_QK_DEFAULT is False
    pc = {**NOCACHE, "tilecore.fast_math": fast, "tilecore.cuda.pingpong": True}  # the turn it moves into
    k = tilecore.compile(_attention(4096, 128, 128, 128, 256, False, heads=32, batch=8), target=HOPPER,
                         pass_configs={**pc, **LATE})
    assert "O's rescale under the next S = Q K^T" in _notes(k)
    dis = tilecore_cuda.CUDABackend().disassemble
    base = tilecore.compile(_attention(4096, 128, 128, 128, 256, False, heads=32, batch=8), target=HOPPER,
                            pass_configs={**pc, **DIRECT})
    on, off = dis(k.binary, HOPPER), dis(base.binary, HOPPER)
    assert _fmul_in_turn(on) == 64 and _fmul_in_turn(off) == 0
    assert "STL" not in on and "LDL" not in on
    total = lambda s: [r["total"] for r in sass_paths.loop_counts(s)]  # noqa: E731
    assert len(total(on)) == 1 and 0 <= total(on)[0] - total(off)[0] <= 1  # the same work (ptxas: 459 / 459, 726 / 725)


@needs_toolchain
def test_rescale_under_qk_fallbacks():
    k = tilecore.compile(_attention(1024, 128, 128, 128, 256, False), target=HOPPER,
                         pass_configs={**NOCACHE, **LATE, "tilecore.cuda.intra_wg_overlap": False})
    assert "O's rescale stays before the turn (needs the intra-warpgroup overlap)" in _notes(k)
    k = tilecore.compile(_attention(1024, 128, 128, 128, 256, False), target=HOPPER,
                         pass_configs={**NOCACHE, **LATE, "tilecore.cuda.softmax_beside_pv": True})
    assert "O's rescale stays before the turn (the softmax beside P @ V" in _notes(k)
    k = tilecore.compile(_attention(1000, 128, 128, 128, 256, False), target=HOPPER, pass_configs={**NOCACHE, **LATE})
    assert "O's rescale stays before the turn (the masked loop runs in two parts" in _notes(k)


@needs_toolchain
@pytest.mark.parametrize("shape,pingpong", [((1024, 128, 128, 128, 256, False), True),
                                            ((1056, 128, 128, 176, 256, False), True),
                                            ((1024, 64, 128, 64, 256, False), False),
                                            ((1152, 64, 192, 64, 384, False), True)],
                         ids=["d128", "d128-176", "d64-no-pingpong", "d64-3wg"])
def test_rescale_under_qk_keeps_the_protocols(shape, pingpong):
    from test_cuda_attention_critical_path import _protocol_problems

    pc = {**NOCACHE, "tilecore.cuda.pingpong": pingpong}
    on = tilecore.compile(_attention(*shape), target=HOPPER, pass_configs={**pc, **LATE}).get_kernel_source()
    off = tilecore.compile(_attention(*shape), target=HOPPER, pass_configs=pc).get_kernel_source()
    assert on != off
    consumers = shape[4] // 128
    assert _protocol_problems(on, off, consumers) == []
    # mutation: the P @ V issued before O's rescale (the rescale then writes O under the WGMMA writing it)
    loop = on[on.index("for (int tc_it = 1;"):]
    resc_start = loop.index("#pragma unroll", loop.index("tc_wgmma_commit();"))
    resc_end = loop.index("tc_wgmma_fence();", resc_start)
    pv_end = loop.index("tc_wgmma_commit();", resc_end) + len("tc_wgmma_commit();")
    swapped = loop[:resc_start] + loop[resc_end:pv_end] + "\n" + loop[resc_start:resc_end] + loop[pv_end:]
    bad = on[:on.index("for (int tc_it = 1;")] + swapped
    assert bad != on and _protocol_problems(bad, off, consumers) != []


@hopper_gpu
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("shape", ["128", "176-whole", "d64-3-whole"])
def test_device_rescale_under_qk_bit_identical(torch_cuda, shape, fast):
    from tilecore_conformance.composite import attention_ref

    inputs, got, k = _device_run(torch_cuda, shape, {**LATE, **TMA}, fast)
    assert "O's rescale under the next S" in _notes(k)
    _, base, _ = _device_run(torch_cuda, shape, {}, fast)
    assert got.tobytes() == base.tobytes()
    seq, dim, *_, causal = SHAPES[shape]
    ref = attention_ref(inputs, "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)
