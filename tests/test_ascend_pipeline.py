"""Ascend event IDs, double buffering and the AIV row split, through tilecore.compile and the emulator.

- Event IDs come from each HardEvent's pool (the profile's ``event_ids_per_hard_event``, 8), every flag
  is set and waited equally often, and the emulator models the IDs: a wait on an ID nobody set, a set on
  an ID still pending (the flag is one bit: exhaustion or reuse) and an ID out of range are findings.
- ``T.Pipelined(num_stages=2)`` double-buffers the tiles its DMA refills (ping/pong, each with its own
  loop-carried flag and event ID): the emulator reports nothing, its timing shows the DMA overlapping the
  compute, and deleting the WAR wait on buffer reuse (V->MTE2, MTE1->MTE2) is caught.
- A mixed kernel's vector part splits the block's rows over the AI Core's two AIV sub-blocks
  (``GetSubBlockIdx``) where it is row-wise; each sub-block waits for the cube's hand-off.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import KernelRuntimeError
from tilecore.plugin import Source

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the Ascend emulator needs g++")


def stream(n=8, stages=2, rows=32):
    """exp-and-accumulate over n row tiles of A: one DMA and three vector instructions per tile."""
    @T.prim_func
    def expsum(A: T.Tensor((rows * n, 64), "float32"), B: T.Tensor((rows, 64), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_shared((rows, 64), "float32")
            acc = T.alloc_fragment((rows, 64), "float32")
            T.clear(acc)
            for k in T.Pipelined(n, num_stages=stages):
                T.copy(A[k * rows, 0], x)
                for i, j in T.Parallel(rows, 64):
                    acc[i, j] = acc[i, j] + T.exp(x[i, j]) * 2.0
            T.copy(acc, B)
    return expsum


def many_tiles():
    """One loop refilling ten UB tiles per trip: more loop-carried flags than V->MTE2 has event IDs."""
    @T.prim_func
    def sums(A: T.Tensor((160, 64), "float32"), B: T.Tensor((16, 64), "float32")):
        with T.Kernel(1) as bx:
            acc = T.alloc_fragment((16, 64), "float32")
            x0 = T.alloc_shared((16, 64), "float32")
            x1 = T.alloc_shared((16, 64), "float32")
            x2 = T.alloc_shared((16, 64), "float32")
            x3 = T.alloc_shared((16, 64), "float32")
            x4 = T.alloc_shared((16, 64), "float32")
            x5 = T.alloc_shared((16, 64), "float32")
            x6 = T.alloc_shared((16, 64), "float32")
            x7 = T.alloc_shared((16, 64), "float32")
            x8 = T.alloc_shared((16, 64), "float32")
            x9 = T.alloc_shared((16, 64), "float32")
            T.clear(acc)
            for k in T.serial(2):
                T.copy(A[0, 0], x0)
                T.copy(A[16, 0], x1)
                T.copy(A[32, 0], x2)
                T.copy(A[48, 0], x3)
                T.copy(A[64, 0], x4)
                T.copy(A[80, 0], x5)
                T.copy(A[96, 0], x6)
                T.copy(A[112, 0], x7)
                T.copy(A[128, 0], x8)
                T.copy(A[144, 0], x9)
                for i, j in T.Parallel(16, 64):
                    acc[i, j] = acc[i, j] + x0[i, j] + x1[i, j] + x2[i, j] + x3[i, j] + x4[i, j]
                for i, j in T.Parallel(16, 64):
                    acc[i, j] = acc[i, j] + x5[i, j] + x6[i, j] + x7[i, j] + x8[i, j] + x9[i, j]
            T.copy(acc, B)
    return sums


def _load(kernel, code=None):
    src = kernel.source if code is None else Source(code, kernel.source.lang, kernel.source.entry, kernel.source.meta)
    return kernel.runtime.load(kernel.runtime.build(src, {}), src)


def _run_stream(prog, n=8):
    a = np.random.default_rng(0).standard_normal((32 * n, 64)).astype(np.float32)
    b = np.zeros((32, 64), np.float32)
    prog.launch([a.ctypes.data, b.ctypes.data], [], [])
    return b, (np.exp(a.astype(np.float64).reshape(n, 32, 64)) * 2).sum(0)


def _flags(code):
    """``{(event, id): (sets, waits)}`` of the generated source."""
    out = {}
    for kind, ev, i in re.findall(r"(SetFlag|WaitFlag)<HardEvent::(\w+)>\((\d+)\)", code):
        s, w = out.get((ev, int(i)), (0, 0))
        out[(ev, int(i))] = (s + (kind == "SetFlag"), w + (kind == "WaitFlag"))
    return out


# -- event IDs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["ascend:910b", "ascend:a3"])
def test_double_buffered_stream_ping_pong_ids(target):
    k = tilecore.compile(stream(), target=target)
    code = k.source.code
    assert "x_pong" in code and "for (int64_t k_2 = 0; k_2 < 4;" in code
    flags = _flags(code)
    # ping and pong each have their own loop-carried V->MTE2 flag, so two IDs of that event are in use
    assert {i for ev, i in flags if ev == "V_MTE2"} == {0, 1}
    assert all(s == w for s, w in flags.values()), flags  # balanced: as many sets as waits per ID
    assert all(0 <= i < 8 for _, i in flags)
    b, ref = _run_stream(_load(k))
    np.testing.assert_allclose(b, ref, rtol=1e-5, atol=1e-4)


def test_loop_carried_flags_stay_within_the_pool():
    """Ten tiles refilled per trip: at most seven loop-carried V->MTE2 flags (one ID kept for flags synced
    in place), the rest synced in place; no ID outside 0..7 and the emulator reports nothing."""
    k = tilecore.compile(many_tiles(), target="ascend:910b")
    flags = _flags(k.source.code)
    ids = {i for ev, i in flags if ev == "V_MTE2"}
    assert ids == set(range(8)), ids
    assert all(s == w for s, w in flags.values())
    a = np.random.default_rng(1).standard_normal((160, 64)).astype(np.float32)
    b = np.zeros((16, 64), np.float32)
    _load(k).launch([a.ctypes.data, b.ctypes.data], [], [])
    np.testing.assert_allclose(b, 2 * a.reshape(10, 16, 64).sum(0), rtol=1e-5, atol=1e-4)


def test_event_id_reused_while_pending_is_caught():
    """Give the pong tile's flag the ping tile's ID: two flags pending on one bit, the second set is lost."""
    k = tilecore.compile(stream(), target="ascend:910b")
    code = k.source.code.replace("HardEvent::V_MTE2>(1)", "HardEvent::V_MTE2>(0)")
    with pytest.raises(KernelRuntimeError, match=r"event ID reused: SetFlag<V_MTE2>\(0\) while the flag set at line "
                                                 r"\d+ is still pending .*line \d+"):
        _run_stream(_load(k, code))


def test_event_id_out_of_the_targets_range_is_caught():
    k = tilecore.compile(stream(), target="ascend:910b")
    code = k.source.code.replace("HardEvent::V_MTE2>(1)", "HardEvent::V_MTE2>(8)")
    with pytest.raises(KernelRuntimeError, match=r"event ID 8 of SetFlag<V_MTE2> outside the target's 0\.\.7"):
        _run_stream(_load(k, code))


def test_wait_on_an_id_nobody_set_is_caught():
    k = tilecore.compile(stream(), target="ascend:910b")
    lines = k.source.code.split("\n")
    first = next(i for i, x in enumerate(lines) if "SetFlag<HardEvent::V_MTE2>(1)" in x)  # the prologue's set
    code = "\n".join(lines[:first] + lines[first + 1:])
    with pytest.raises(KernelRuntimeError, match=r"unbalanced: WaitFlag<V_MTE2>\(1\) with no SetFlag before it"):
        _run_stream(_load(k, code))


def test_flag_left_set_at_kernel_end_is_caught():
    k = tilecore.compile(stream(), target="ascend:910b")
    lines = k.source.code.split("\n")
    last = max(i for i, x in enumerate(lines) if "WaitFlag<HardEvent::V_MTE2>(1)" in x)  # the epilogue's wait
    code = "\n".join(lines[:last] + lines[last + 1:])
    with pytest.raises(KernelRuntimeError, match=r"unbalanced: SetFlag<V_MTE2>\(1\) at line \d+ is never waited"):
        _run_stream(_load(k, code))


# -- double buffering ------------------------------------------------------------------------------------

def test_double_buffering_overlaps_dma_and_vector():
    """Same kernel, num_stages 1 and 2: both report nothing and compute the same numbers; with two stages the
    emulator's makespan is shorter for the same work (the DMA of tile k+1 runs during the compute of tile k)."""
    spans = {}
    for stages in (1, 2):
        k = tilecore.compile(stream(stages=stages), target="ascend:910b")
        prog = _load(k)
        b, ref = _run_stream(prog)
        np.testing.assert_allclose(b, ref, rtol=1e-5, atol=1e-4)
        spans[stages] = prog.cycles
        assert ("x_pong" in k.source.code) == (stages == 2)
    (m1, w1), (m2, w2) = spans[1], spans[2]
    assert abs(w1 - w2) < 1e-6 * w1  # the same instructions
    assert m2 < 0.95 * m1 and w2 / m2 > 1.3, spans  # more pipe overlap


def test_deleted_war_wait_on_buffer_reuse_is_caught():
    """Delete the pong tile's V->MTE2 wait in the loop: its refill races the vector unit's reads of it."""
    k = tilecore.compile(stream(), target="ascend:910b")
    lines = k.source.code.split("\n")
    loop = next(i for i, x in enumerate(lines) if "for (int64_t k_2" in x)
    at = next(i for i in range(loop, len(lines)) if "WaitFlag<HardEvent::V_MTE2>(1)" in lines[i])
    code = "\n".join(lines[:at] + lines[at + 1:])
    with pytest.raises(KernelRuntimeError, match=r"WAR: MTE2 overwrites UB-buffer 'x_pong' .* read by V at line \d+ "
                                                 r"with no V->MTE2 sync, line \d+"):
        _run_stream(_load(k, code))


def _gemm(stages=2):
    from tilecore_conformance import catalog

    return catalog._gemm_kernel("float16", "float32", False, False, 64, 64, 256, tile=(64, 64, 32, 128),
                                stages=stages)


def _gemm_run(prog):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 256)).astype(np.float16)
    b = rng.standard_normal((256, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    prog.launch([a.ctypes.data, b.ctypes.data, c.ctypes.data], [], [])
    return c, a.astype(np.float64) @ b.astype(np.float64)


def test_cube_gemm_double_buffers_l1():
    k = tilecore.compile(_gemm(2), target="ascend:910b")
    code = k.source.code
    assert "A_s_pong" in code and "B_s_pong" in code
    assert {i for ev, i in _flags(code) if ev == "MTE1_MTE2"} >= {0, 1, 2, 3}  # A, B, A pong, B pong
    prog = _load(k)
    c, ref = _gemm_run(prog)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=2e-3)
    serial = _load(tilecore.compile(_gemm(1), target="ascend:910b"))
    _gemm_run(serial)
    assert prog.cycles[0] < serial.cycles[0], (prog.cycles, serial.cycles)


def test_deleted_l1_reuse_wait_is_caught():
    k = tilecore.compile(_gemm(2), target="ascend:910b")
    lines = k.source.code.split("\n")
    loop = next(i for i, x in enumerate(lines) if "for (int64_t " in x)
    at = next(i for i in range(loop, len(lines)) if "WaitFlag<HardEvent::MTE1_MTE2>(2)" in lines[i])
    code = "\n".join(lines[:at] + lines[at + 1:])
    with pytest.raises(KernelRuntimeError, match=r"WAR: MTE2 overwrites L1-buffer 'A_s_pong' .* read by MTE1 .* "
                                                 r"no MTE1->MTE2 sync"):
        _gemm_run(_load(k, code))


# -- the mixed kernel's two AIV sub-blocks -----------------------------------------------------------------

def readme_gemm(M=200, N=128, K=96, bm=64, bn=64, bk=32):
    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_shared = T.alloc_shared((bm, bk), "float16")
            B_shared = T.alloc_shared((bk, bn), "float16")
            C_local = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=3):
                T.copy(A[by * bm, ko * bk], A_shared)
                T.copy(B[ko * bk, bx * bn], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(bm, bn):
                C_local[i, j] = T.max(C_local[i, j], 0)
            T.copy(C_local, C[by * bm, bx * bn])
    return kernel


def gemm_rowsum(M=128, N=64, K=64, bm=64, bn=64, bk=32):
    """A gemm whose vector part reduces each row (not split: sub-block 0 does it, both wait for the AIC)."""
    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), S: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm)) as (bx, by):
            A_shared = T.alloc_shared((bm, bk), "float16")
            B_shared = T.alloc_shared((bk, bn), "float16")
            C_local = T.alloc_fragment((bm, bn), "float32")
            r = T.alloc_fragment((bm,), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[by * bm, ko * bk], A_shared)
                T.copy(B[ko * bk, bx * bn], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.reduce_sum(C_local, r, dim=1)
            T.copy(r, S[by * bm])
    return kernel


def _readme_run(prog, M=200, N=128, K=96):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.zeros((M, N), np.float16)
    prog.launch([a.ctypes.data, b.ctypes.data, c.ctypes.data], [], [])
    return c.astype(np.float64), np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)


@pytest.mark.parametrize("target", ["ascend:910b", "ascend:a3"])
def test_vector_part_splits_rows_over_the_two_aiv_sub_blocks(target):
    k = tilecore.compile(readme_gemm(), target=target)
    src = k.source
    assert src.meta["kernel_type"] == "KERNEL_TYPE_MIX_AIC_1_2" and src.meta["aiv_rows_per_sub_block"] == 32
    aiv = src.code[src.code.index("if ASCEND_IS_AIV"):]
    assert "const int64_t aiv_sub = GetSubBlockIdx();" in aiv and "GetSubBlockIdx() == 0" not in aiv
    assert "Maxs(C_local, C_local, (float)(0.0f), 2048);" in aiv  # half of the 64 x 64 tile per sub-block
    c, ref = _readme_run(_load(k))  # the edge block (rows 192..199) too: sub-block 1 has no valid row there
    np.testing.assert_allclose(c, ref, rtol=2e-3, atol=2e-2)


def test_both_sub_blocks_do_their_half():
    """Make every AIV believe it is sub-block 0: the rows of sub-block 1 are never written, so the split is
    what computes them (and sequential emulation of both sub-blocks reports nothing else)."""
    k = tilecore.compile(readme_gemm(), target="ascend:910b")
    code = k.source.code.replace("const int64_t aiv_sub = GetSubBlockIdx();", "const int64_t aiv_sub = 0;")
    c, ref = _readme_run(_load(k, code))
    rows = (np.arange(200) // 32) % 2 == 1
    np.testing.assert_allclose(c[~rows], ref[~rows], rtol=2e-3, atol=2e-2)
    assert np.all(c[rows] == 0) and np.abs(ref[rows]).max() > 1


def test_each_sub_block_waits_for_the_cube():
    """Mode-2 cross-core flags are per AIV: deleting the hand-off wait leaves both sub-blocks' flags unwaited
    and sub-block 1's workspace read unordered."""
    k = tilecore.compile(readme_gemm(), target="ascend:910b")
    code = k.source.code.replace("CrossCoreWaitFlag(0);", "")
    with pytest.raises(KernelRuntimeError, match=r"RAW across cores(.|\n)*never waited by AIV sub-block 0(.|\n)*"
                                                 r"never waited by AIV sub-block 1"):
        _readme_run(_load(k, code))


def test_row_reduction_stays_on_sub_block_zero():
    k = tilecore.compile(gemm_rowsum(), target="ascend:910b")
    src = k.source
    assert src.meta["aiv_rows_per_sub_block"] is None
    aiv = src.code[src.code.index("if ASCEND_IS_AIV"):]
    assert aiv.index("CrossCoreWaitFlag(0);") < aiv.index("if (GetSubBlockIdx() == 0) {")  # both sub-blocks wait
    rng = np.random.default_rng(5)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    s = np.zeros(128, np.float32)
    _load(k).launch([a.ctypes.data, b.ctypes.data, s.ctypes.data], [], [])
    np.testing.assert_allclose(s, (a.astype(np.float64) @ b.astype(np.float64)).sum(1), rtol=1e-3, atol=5e-3)


# -- the device runtime (CANN) -------------------------------------------------------------------------------

def test_device_runtime_is_importable_and_refuses_clearly_here(monkeypatch, tmp_path):
    """No CANN here: the device path imports, the probe says why it is not used, the target runs emulated,
    and building for the NPU refuses with the reason and the fix."""
    from tilecore_ascend import runtime as rt

    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "TILECORE_ASCEND_EMULATE"):
        monkeypatch.delenv(var, raising=False)
    if rt.cann_home() is not None:
        pytest.skip("a CANN toolkit is installed here")
    ok, why = rt.device_status()
    assert not ok and "no CANN toolkit" in why
    import tilecore_ascend

    probe = tilecore_ascend.AscendBackend().probe()
    assert probe.status == "ok" and "not on an NPU (no CANN toolkit" in probe.detail
    k = tilecore.compile(stream(), target="ascend:910b")
    assert k.mode == "emulated" and isinstance(k.runtime, rt.AscendEmulatedRuntime)
    dev = rt.AscendDeviceRuntime("910b")
    assert dev.mode() == "device" and dev.tensor_device == "npu"
    with pytest.raises(tilecore.errors.CompileError, match=r"cannot build for the NPU here: no CANN toolkit .* "
                                                             r"Install CANN and set ASCEND_HOME_PATH"):
        dev.build(k.source, {})


def test_device_build_command_with_a_stand_in_bisheng(monkeypatch, tmp_path):
    """A toolkit folder whose bisheng only records its arguments: the build passes the target's NPU arch, the
    AscendC language mode, the CANN include/library paths and the generated source without TC_ASCEND_EMU (so
    it includes kernel_operator.h and the tc_call launcher); without torch_npu the device stays unused."""
    from tilecore_ascend import runtime as rt

    home = tmp_path / "cann"
    (home / "bin").mkdir(parents=True)
    log = tmp_path / "args.txt"
    fake = home / "bin" / "bisheng"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {log}\nfor a; do [ \"$prev\" = -o ] && printf ELF > \"$a\"; "
                    "prev=$a; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(home))
    monkeypatch.delenv("TILECORE_ASCEND_EMULATE", raising=False)
    ok, why = rt.device_status()
    assert not ok and ("torch_npu is not importable" in why or "NPU" in why)
    k = tilecore.compile(readme_gemm(), target="ascend:a3")
    assert rt.AscendDeviceRuntime("a3").build(k.source, {}) == b"ELF"
    args = log.read_text().split("\n")
    assert "--npu-arch=dav-2201" in args and "-xasc" in args and "--shared" in args
    assert f"-I{home}/include" in args and f"-L{home}/lib64" in args and "-lascendcl" in args
    assert not any(a.startswith("-DTC_ASCEND_EMU") for a in args)
    code = k.source.code
    device = code[code.rindex("#else"):]
    assert "tc_kernel<<<(uint32_t)((2) * (4)), nullptr, tc_stream>>>(" in device and "(GM_ADDR)tc_ws" in device
    assert k.source.meta["workspace_bytes_per_block"] == 64 * 64 * 4


def test_tile_without_room_for_a_second_copy_stays_serial():
    """A 96 KiB UB tile cannot be doubled next to the reduction's scratch in 192 KiB: the loop stays serial,
    right and clean."""
    @T.prim_func
    def colsum(A: T.Tensor((384 * 3, 64), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(1) as bx:
            x = T.alloc_shared((384, 64), "float32")
            r = T.alloc_fragment((64,), "float32")
            T.clear(r)
            for k in T.Pipelined(3, num_stages=2):
                T.copy(A[k * 384, 0], x)
                T.reduce_sum(x, r, dim=0, clear=False)
            T.copy(r, B)

    k = tilecore.compile(colsum, target="ascend:910b")
    assert "x_pong" not in k.source.code and k.source.meta["onchip_bytes"]["ub"] <= 196608
    a = np.random.default_rng(6).standard_normal((1152, 64)).astype(np.float32)
    b = np.zeros(64, np.float32)
    _load(k).launch([a.ctypes.data, b.ctypes.data], [], [])
    np.testing.assert_allclose(b, a.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)


def test_each_kernel_library_keeps_its_own_emulator_state(tmp_path):
    """The emulator's state lives in function-local statics; built without -fno-gnu-unique they are
    STB_GNU_UNIQUE symbols that every kernel library in the process shares, and one kernel's record of the
    cube's workspace writes leaked into another's emulation under pytest-xdist (a finding in a kernel with no
    cube). The built library exports no unique symbols."""
    import shutil
    import subprocess

    nm = shutil.which("nm")
    assert nm, "binutils' nm is installed with the C++ compiler the emulator needs"
    k = tilecore.compile(readme_gemm(), target="ascend:910b")
    lib = tmp_path / "kernel.so"
    lib.write_bytes(k.runtime.build(k.source, {}))
    syms = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    assert [ln for ln in syms.splitlines() if ln.split()[1:2] == ["u"]] == []
