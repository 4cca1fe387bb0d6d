"""Programmatic dependent launch (docs/decisions.md D76, ``tilecore.cuda.programmatic_launch``, off by default).

A kernel compiled with the option starts with ``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait`` and is
launched by ``cuLaunchKernelEx`` with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the next launch in the
stream may begin while this one's last blocks run, and waits at its top for this one's memory.

Checked here without a GPU: the two instructions at the top of the kernel's body (before anything reads or writes
memory), the metadata the runtime reads, the SASS (PREEXIT, ACQBULK before the first global or shared access), the
option off leaving the source as it was, sm_80 left alone, a clear error for a bad value.

On an sm_90 GPU (skipped here): a chain of GEMMs each reading the previous one's output, launched back to back with
the option (X <- X @ P for a permutation P: exact in fp16, so any launch that read a tile before the previous kernel
wrote it shows as a wrong element), against the chain without it; and the compiled launcher left aside for it.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import tilecore
from tilecore.errors import CompileError

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from test_cuda_backend import needs_toolchain  # noqa: E402
from test_cuda_hopper import hopper_gpu  # noqa: E402

from _bench import tile_gemm  # noqa: E402

PDL = {"tilecore.cuda.programmatic_launch": True}


def _gemm(size=1024, bm=128, bn=256, bk=64, threads=256, stages=3, panel=8, dtype="float16"):
    return tile_gemm(size, size, size, bm, bn, bk, threads, stages, dtype=dtype, panel=panel)


def _body(code: str) -> list:
    i = code.index(" tc_kernel(")
    j = code.index(") {\n", i) + 4
    return [ln.strip() for ln in code[j:].splitlines() if ln.strip()]


@needs_toolchain
def test_the_kernel_waits_at_its_top_and_says_so_in_its_metadata():
    on = tilecore.compile(_gemm(), target="cuda:sm_90a", pass_configs=PDL)
    off = tilecore.compile(_gemm(), target="cuda:sm_90a")
    body = _body(on.get_kernel_source())
    assert body[0] == 'asm volatile("griddepcontrol.launch_dependents;" ::: "memory");'
    assert body[1] == 'asm volatile("griddepcontrol.wait;" ::: "memory");'
    assert on.meta["source"]["meta"]["programmatic_launch"] is True
    assert "programmatic_launch" not in off.meta["source"]["meta"]
    assert "griddepcontrol" not in off.get_kernel_source()
    # the option adds exactly the two lines
    assert _body(on.get_kernel_source())[2:] == _body(off.get_kernel_source())


@needs_toolchain
def test_the_sass_waits_before_any_memory_access():
    import tilecore_cuda

    k = tilecore.compile(_gemm(), target="cuda:sm_90a", pass_configs=PDL)
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)]
    assert "PREEXIT" in ops and "ACQBULK" in ops
    first_mem = min(i for i, op in enumerate(ops) if re.match(r"(LDG|STG|LDS|STS|UTMALDG|UTMASTG|SYNCS|LDSM|STSM)", op))
    assert ops.index("ACQBULK") < first_mem


@needs_toolchain
def test_sm80_and_bad_values():
    k = tilecore.compile(_gemm(256, 128, 128, 32, 128, 2, 0), target="cuda:sm_80", pass_configs=PDL)
    assert "griddepcontrol" not in k.get_kernel_source()
    with pytest.raises(CompileError, match="tilecore.cuda.programmatic_launch"):
        tilecore.compile(_gemm(), target="cuda:sm_90a", pass_configs={"tilecore.cuda.programmatic_launch": "soon"})


@hopper_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_device_a_chain_of_dependent_gemms_reads_each_result_whole(dtype):
    import torch

    size, steps = 4096, 24
    tdt = getattr(torch, dtype)
    k = tilecore.compile(_gemm(size, dtype=dtype), target="cuda", pass_configs=PDL)
    plain = tilecore.compile(_gemm(size, dtype=dtype), target="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(size, size, device="cuda", generator=g).to(tdt)
    perm = torch.randperm(size, device="cuda", generator=g)
    p = torch.zeros(size, size, device="cuda", dtype=tdt)
    p[torch.arange(size, device="cuda"), perm] = 1  # X @ P moves column i of X to column perm[i]: exact
    outs = {}
    for name, kern in (("pdl", k), ("plain", plain)):
        bufs = [x0.clone(), torch.empty_like(x0)]
        torch.cuda.synchronize()
        for i in range(steps):  # back to back, no synchronization: each reads the buffer the one before wrote
            kern(bufs[i % 2], p, bufs[(i + 1) % 2])
        torch.cuda.synchronize()
        outs[name] = bufs[steps % 2]
    want = x0.clone()
    for _ in range(steps):
        want = want[:, torch.argsort(perm)]
    assert torch.equal(outs["plain"], want)
    assert torch.equal(outs["pdl"], want)
    assert k._native is None  # the Python path: cuLaunchKernelEx with the attribute, not the compiled launcher
