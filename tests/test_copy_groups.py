"""One asynchronous group for consecutive copies into shared memory (``tilecore.group_async_copies``, D42).

- TileLang's layernorm (tests/tilelang_corpus/norm_layernorm_fwd.py, its kernel code unchanged; float16 and a
  small row so the host emulators run it): X, gamma and beta are issued as 16-byte ``cp.async`` copies, one
  ``commit_group``, one ``wait_group 0``, one barrier (CUDA sm_80 and sm_90a); the kernel runs on the CUDA host
  emulator (copies land only at the wait) against float64, and on the HIP (gfx942: 4-byte ``global_load_lds``)
  and MUSA (mp_31) emulators;
- mutations: the wait dropped, or the group's barrier dropped, give wrong numbers (or the emulator's stale-read
  failure); unmutated passes;
- what is not grouped: one copy alone (the target's own copy; CUDA's one-row copies now take its 16-byte path),
  two copies into one buffer, copies inside a pipelined loop (the planner's), copies the target's table makes
  bulk tile copies (MUSA PH1's TME loads), targets without asynchronous copies (WebGPU, cpu), checked mode.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T

sys.path.insert(0, str(Path(__file__).parent))

NOCACHE = {"tilecore.disable_cache": True}
N, D = 4, 512


def _layernorm(n=N, d=D, threads=256):
    from tilelang_corpus.norm_layernorm_fwd import _layernorm_fwd

    return _layernorm_fwd.get_tir(n, d, threads=threads, in_dtype="float16", out_dtype="float16")


def _compile(target, func=None, **cfg):
    return tilecore.compile(func if func is not None else _layernorm(), target=target, out_idx=[-3, -2, -1],
                            pass_configs={**NOCACHE, **cfg})


def _inputs(seed=3):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((N, D)) * 2 + 0.5).astype(np.float16)
    g, b = rng.standard_normal(D).astype(np.float16), rng.standard_normal(D).astype(np.float16)
    return x, g, b


def _check(run, k):
    x, g, b = _inputs()
    out = run(k, [x, g, b, np.full((N, D), np.nan, np.float16), np.full(N, np.nan, np.float32),
                  np.full(N, np.nan, np.float32)])
    x64 = x.astype(np.float64)
    mean, var = x64.mean(-1), x64.var(-1)
    rstd = 1 / np.sqrt(var + 1e-5)
    y = (x64 - mean[:, None]) * rstd[:, None] * g.astype(np.float64) + b.astype(np.float64)
    np.testing.assert_allclose(out[4], mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[5], rstd, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[3].astype(np.float64), y, rtol=1e-2, atol=1e-2)


def _cuda_run():
    pytest.importorskip("tilecore_cuda")
    if shutil.which("g++") is None:
        pytest.skip("the CUDA host emulator needs g++ (C++20)")
    from cuda_host_emulator import run_on_host

    return run_on_host


def _body(k) -> str:
    code = k.get_kernel_source()
    return code[code.rindex("__global__"):]


def _mutant(k, code):
    return types.SimpleNamespace(source=dataclasses.replace(k.source, code=code))


@pytest.mark.parametrize("target", ["cuda:sm_80", "cuda:sm_90a"])
def test_layernorm_copies_are_one_group(target):
    pytest.importorskip("tilecore_cuda")
    k = _compile(target)
    assert list(k.meta["attrs"]["copy_groups"]) == ["X_smem, G_smem, B_smem: one async group (16-byte copies)"]
    body = _body(k)
    assert "tc_copy_g2s_async" not in body
    assert body.count("tc_cp_async16(") == 3 and body.count("tc_cp_async_commit()") == 1
    assert body.count("tc_cp_async_wait<0>()") == 1
    # every copy is issued before the one wait, and the wait is followed by one barrier before the first read
    last_issue, wait = body.rindex("tc_cp_async16("), body.index("tc_cp_async_wait<0>()")
    first_read = body.index("X_smem[(")
    assert last_issue < wait < first_read
    assert body[wait:first_read].count("__syncthreads()") == 1
    assert body[:wait].count("__syncthreads()") == 0  # no barrier between the copies
    # the row index is in bounds for every block (grid = rows): no predicate on the copies
    assert "tc_p" not in body
    assert 0 in k.source.meta["aligned_args"] and 1 in k.source.meta["aligned_args"]  # X and gamma are read 16 bytes at a time


def test_layernorm_runs_on_the_cuda_emulator():
    run = _cuda_run()
    _check(run, _compile("cuda:sm_80"))


def test_mutations_are_caught_by_the_emulator():
    """The wait dropped (the copies never land before the reads: stale shared memory) and the barrier after the
    wait dropped (a thread reads what another thread's copies brought): each fails; unmutated passes above."""
    run = _cuda_run()
    k = _compile("cuda:sm_80")
    head, kern, body = k.source.code.partition('extern "C"')
    code = head + kern + body
    no_wait = head + kern + body.replace("tc_cp_async_wait<0>();", "", 1)
    assert no_wait != code
    with pytest.raises((AssertionError, RuntimeError)):
        _check(run, _mutant(k, no_wait))
    before, sep, after = body.partition("tc_cp_async_wait<0>();")
    no_barrier = head + kern + before + sep + after.replace("__syncthreads();", "", 1)
    # without the barrier each thread reads its own copies only; the layout gives the copy's chunk i of a row
    # to thread i % 256 and the fragment's element j to thread j % 256: other threads' data
    with pytest.raises((AssertionError, RuntimeError)):
        for _ in range(3):  # the threads race: three runs
            _check(run, _mutant(k, no_barrier))


def test_layernorm_on_the_hip_and_musa_emulators():
    pytest.importorskip("tilecore_hip")
    import hip_host_emulator

    if hip_host_emulator.compiler() is None:
        pytest.skip("the HIP host emulator needs clang++")
    k = _compile("hip:gfx942")
    assert k.meta["attrs"]["copy_groups"][0].endswith("one async group (4-byte copies)")
    assert _body(k).count("tc_async_wait();") == 1
    _check(hip_host_emulator.run_on_host, k)
    pytest.importorskip("tilecore_musa")
    import musa_host_emulator

    k = _compile("musa:mp_31")
    assert len(k.meta["attrs"]["copy_groups"]) == 1 and _body(k).count("tc_async_wait();") == 1
    _check(musa_host_emulator.run_on_host, k)


@T.prim_func
def _one_copy(A: T.Tensor((8, 256), "float16"), B: T.Tensor((8, 256), "float16")):
    with T.Kernel(8, threads=128) as bx:
        s = T.alloc_shared((256,), "float16")
        T.copy(A[bx, 0:256], s)
        for j in T.Parallel(256):
            B[bx, j] = s[j] * 2


@T.prim_func
def _same_buffer_twice(A: T.Tensor((8, 256), "float16"), B: T.Tensor((8, 256), "float16")):
    with T.Kernel(4, threads=128) as bx:
        s = T.alloc_shared((256,), "float16")
        T.copy(A[bx, 0:256], s)
        T.copy(A[bx + 4, 0:256], s)
        for j in T.Parallel(256):
            B[bx, j] = s[j]


def test_one_row_copy_takes_the_16_byte_path():
    """A copy alone keeps CUDA's ``tc_copy_g2s_async``; a one-row copy passes its row length as the stride the
    helper tests for alignment (it passed 1 element, which sent every one-row copy to element copies)."""
    run = _cuda_run()
    k = tilecore.compile(_one_copy, target="cuda:sm_80", pass_configs=NOCACHE)
    body = _body(k)
    assert "copy_groups" not in k.meta["attrs"]
    call = re.search(r"tc_copy_g2s_async<128, 1, 256, 256>\(([^;]*)\);", body).group(1)
    assert "(long long)(256)" in call.split(",")[2] + call, call
    a = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float16)
    out = run(k, [a, np.zeros_like(a)])[1]
    np.testing.assert_array_equal(out, a * np.float16(2))


def test_not_grouped():
    pytest.importorskip("tilecore_cuda")
    k = tilecore.compile(_same_buffer_twice, target="cuda:sm_80", pass_configs=NOCACHE)
    assert "copy_groups" not in k.meta["attrs"]  # two copies into one buffer: they would race
    assert "copy_groups" not in _compile("cuda:sm_80", **{"tilecore.checked": True}).meta["attrs"]
    for target in ("cpu", "webgpu"):  # no asynchronous copies: as before
        k = _compile(target)
        assert "copy_groups" not in k.meta["attrs"], target
    pytest.importorskip("tilecore_musa")
    from test_musa_backend import tme_gemm32

    # copies the target's table gives to bulk tile copies (MUSA PH1's TME loads) stay the backend's
    k = tilecore.compile(tme_gemm32(100, 72, 40), target="musa:mp_31", pass_configs=NOCACHE)
    assert "copy_groups" not in k.meta["attrs"] and k.source.meta["vendor"]["tme_loads"] == 2


def _gemm(loop, stages=0):
    @T.prim_func
    def gemm(A: T.Tensor((128, 128), "float16"), B: T.Tensor((128, 128), "float16"),
             C: T.Tensor((128, 128), "float32")):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            A_s = T.alloc_shared((64, 32), "float16")
            B_s = T.alloc_shared((32, 64), "float16")
            C_f = T.alloc_fragment((64, 64), "float32")
            T.clear(C_f)
            for ko in (T.Pipelined(4, num_stages=stages) if loop == "pipelined" else T.serial(4)):
                T.copy(A[by * 64, ko * 32], A_s)
                T.copy(B[ko * 32, bx * 64], B_s)
                T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C[by * 64, bx * 64])

    return gemm


def test_pipelined_loops_are_left_to_the_planner():
    pytest.importorskip("tilecore_cuda")
    # the core's planner: the register programs would take this kernel whole (its 64-byte tiles, D47)
    k = tilecore.compile(_gemm("pipelined", 2), target="cuda:sm_80",
                         pass_configs={**NOCACHE, "tilecore.cuda.register_programs": False})
    assert "copy_groups" not in k.meta["attrs"] and k.meta["attrs"]["pipelines"]


@pytest.mark.parametrize("target", ["cuda:sm_80", "hip:gfx942"])
def test_copies_in_a_serial_loop_are_one_group_per_iteration(target):
    """A K loop without stages: A's and B's tiles in one group each iteration; on the emulators against float64
    (the next iteration's copies must not overwrite tiles the gemm still reads: the barrier after it)."""
    if target.startswith("cuda"):
        run = _cuda_run()
    else:
        pytest.importorskip("tilecore_hip")
        import hip_host_emulator

        if hip_host_emulator.compiler() is None:
            pytest.skip("the HIP host emulator needs clang++")
        run = hip_host_emulator.run_on_host
    k = tilecore.compile(_gemm("serial"), target=target, pass_configs=NOCACHE)
    width = 16 if target.startswith("cuda") else 4
    assert list(k.meta["attrs"]["copy_groups"]) == [f"A_s, B_s: one async group ({width}-byte copies)"]
    body = _body(k)
    if target.startswith("cuda"):
        assert body.count("tc_cp_async_commit()") == 1 and body.count("tc_cp_async_wait<0>()") == 1
    else:
        assert body.count("tc_async_wait();") == 1
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal((128, 128)).astype(np.float16) for _ in range(2))
    out = run(k, [a, b, np.full((128, 128), np.nan, np.float32)])[2]
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)
