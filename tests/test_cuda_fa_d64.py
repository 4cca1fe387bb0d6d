"""FlashAttention at d64 with two consumer warpgroups on the general path (decision D81).

``tilecore.cuda.descriptor_offsets`` "auto" (the default) takes the descriptor offsets (D59 / D66: each wgmma
descriptor of an unrolled k loop as the first step's plus a constant, one 64-bit add) also in a kernel with
ping-pong's turns whose gemm reading registers issues wgmma instructions of n64 or narrower: FlashAttention's P @ V at
d64 (m64n64k16, 32 tensor-pipe cycles each). Without them ptxas put 5 uniform instructions of descriptor arithmetic
between each of P @ V's 8 HGMMA inside the turn (the gemms' issue window 71 instructions, 57 uniform, against the
register program's 30 / 16). Other forms keep their kernels: d128 / GQA / d256 (wider instructions), one consumer
warpgroup at 64x64 (no turns).

Compile-only wherever a CUDA compiler exists: the sources and the main loop's SASS (tests/sass_paths.py). On an sm_90
GPU: D81's kernels bit for bit the kernels before D81 (the option off) and against float64, causal and not, a ragged
sequence, both blocks; fast math against float64.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_fa_parity import NODESC, _reference, fa  # noqa: E402
from test_cuda_hopper import HOPPER, hopper_gpu  # noqa: E402

import tilecore  # noqa: E402
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402

DESC = {"tilecore.cuda.descriptor_offsets": True}


def _window(k) -> tuple:
    """(instructions, uniform instructions) from the main loop's first WARPGROUP.ARRIVE to its last HGMMA on the
    fewest-instruction path: the gemms' issue inside ping-pong's turn."""
    ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
    idx = sass_paths.main_loop(ins, 12)
    ops = [sass_paths.opcode(ins[i][1]) for i in idx]
    last = max(i for i, o in enumerate(ops) if o == "HGMMA")
    w = ops[ops.index("WARPGROUP"):last + 1]
    return len(w), sum(o.startswith("U") and o != "UTMALDG" for o in w)


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_d64_turns_issue_the_gemms_back_to_back(fast):
    """d64 128x128 (non-causal: one path through the loop): "auto" is the offsets' kernel (True), not the kernel without
    them; the gemms' issue window within 8 uniform instructions of the register program's, 30 fewer than without."""
    auto, off, on = fa(64, 128, 128, fast=fast), fa(64, 128, 128, fast=fast, **NODESC), fa(64, 128, 128, fast=fast, **DESC)
    assert "tc_wg_desc_at(" in auto.get_kernel_source()
    assert auto.get_kernel_source() == on.get_kernel_source() != off.get_kernel_source()
    rp = fa(64, 128, 128, fast=fast, **{"tilecore.cuda.register_programs": True})
    (n_a, u_a), (n_o, u_o), (n_r, u_r) = _window(auto), _window(off), _window(rp)
    assert u_a <= u_r + 8 and u_a <= u_o - 30, (u_a, u_o, u_r)
    assert n_a < n_o


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_d64_at_128x176_takes_the_offsets_too(causal):
    """d64 128x176 (ragged at 4096: the masked iteration unswitched) is of the rule's form: "auto" = True, no spill."""
    auto, on = fa(64, 128, 176, causal), fa(64, 128, 176, causal, **DESC)
    assert auto.get_kernel_source() == on.get_kernel_source()
    sass = tilecore_cuda.CUDABackend().disassemble(auto.binary, auto.target)
    ops = [sass_paths.opcode(t) for _, t in sass_paths.parse(sass)]
    assert ops.count("LDL") + ops.count("STL") == 0


@needs_toolchain
@pytest.mark.parametrize("form", [(128, 128, 128, 256, None), (128, 128, 128, 256, 8), (128, 128, 176, 256, None),
                                  (64, 64, 64, 128, None), (128, 64, 64, 128, None)],
                         ids=["d128", "gqa", "d128-176", "d64-64x64", "d128-64x64"])
def test_other_forms_keep_their_kernels(form):
    """Wider register-operand instructions (d128, GQA: n128) or no turns (one consumer warpgroup at 64x64): "auto"
    leaves the offsets off there, as before D81 (d256 takes them since D66 by its k steps)."""
    dim, bm, bn, threads, kvh = form
    for causal in (False, True):
        func = flash_attention_forward(4096, dim, 32, bm, bn, "float16", causal, batch=8, threads=threads, num_stages=2,
                                       kv_heads=kvh)
        from tilecore.compiler import lower

        cfg = {"tilecore.cuda.register_programs": False}
        auto = lower(func, HOPPER, cfg)[3].code
        assert "tc_wg_desc_at(" not in auto
        assert auto == lower(func, HOPPER, {**cfg, **NODESC})[3].code


@needs_toolchain
def test_the_register_program_route_is_unchanged():
    """The route (D77's AUTO_GENERAL) decides where d64's two-consumer form runs; D81's rule changes only the general
    path's kernel: the register program's source is the same with the option off."""
    func = flash_attention_forward(4096, 64, 32, 128, 128, "float16", False, batch=8, threads=256, num_stages=2)
    src = [tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={
        **NOCACHE, "tilecore.cuda.register_programs": True, **x}).get_kernel_source() for x in ({}, NODESC)]
    assert src[0] == src[1]


# -- on an sm_90 GPU ------------------------------------------------------------------------------------------

@hopper_gpu
@pytest.mark.parametrize("seq", [1000, 1024])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bn", [128, 176])
def test_d81_gives_the_bits_before_and_matches_float64(bn, causal, seq):
    """Exact build: D81's kernel (the default) bit for bit the kernel without the offsets, and against float64."""
    import torch

    heads, batch = 3, 2
    g = torch.Generator(device="cuda").manual_seed(81)
    q, k, v = (torch.randn(batch, heads, seq, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    out = fa(64, 128, bn, causal, seq=seq, heads=heads, batch=batch)(q, k, v)
    before = fa(64, 128, bn, causal, seq=seq, heads=heads, batch=batch, **NODESC)(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(out, before)
    err = (out.double() - _reference(q, k, v, causal)).abs().max().item()
    assert err < 2e-3, f"bn={bn} causal={causal} seq={seq}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bn", [128, 176])
def test_d81_fast_math_matches_float64(bn, causal):
    import torch

    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(82)
    q, k, v = (torch.randn(batch, heads, seq, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    out = fa(64, 128, bn, causal, fast=True, seq=seq, heads=heads, batch=batch)(q, k, v)
    torch.cuda.synchronize()
    err = (out.double() - _reference(q, k, v, causal)).abs().max().item()
    assert err < 4e-3, f"bn={bn} causal={causal}: max error {err}"
