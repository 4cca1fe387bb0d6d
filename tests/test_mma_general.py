"""The sm_80 (mma.sync) register program against the core's general path, decision D63.

``benchmarks/mma_general.py``'s kernels (GEMM + bias + ReLU, TileLang's FlashAttention forward causal and not,
softmax, RMSNorm, the 777-column GEMM) on ``cuda:sm_80`` and on ``cuda:sm_90a`` with
``tilecore.cuda.disable_wgmma`` (how the H100 runs the sm_80 paths): which path each takes, that the general path
holds every fragment in registers, and (on a GPU) that every path matches a float64 reference.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "benchmarks"))
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402

import mma_general  # noqa: E402
import tilecore  # noqa: E402
from tilecore.compiler import lower  # noqa: E402

REGPROG = {**NOCACHE, **mma_general.VARIANTS["regprog"]}
GENERAL = {**NOCACHE, **mma_general.VARIANTS["general"]}
SM80_ON_H100 = mma_general.BASE  # disable_wgmma + the sm_80 profile overlaid (tilecore.capability_overlay)


class Small:
    gemm = (256, 384, 320)
    gemm777 = (256, 777, 320)
    fa = (2, 2, 512, 128)
    rows = (64, 8192)


def _attrs(name, target, configs):
    build, own, _ = mma_general.KERNELS[name]
    return lower(build(Small), target, {**own, **configs})[2].attrs


def _path(attrs):
    class K:
        meta = {"attrs": attrs}
    return tilecore_cuda.lowering_path(K)


@pytest.mark.parametrize("target,extra", [("cuda:sm_80", {}), ("cuda:sm_90a", SM80_ON_H100)])
@pytest.mark.parametrize("name", list(mma_general.KERNELS))
def test_general_path_holds_every_fragment_in_registers(name, target, extra):
    attrs = _attrs(name, target, {**GENERAL, **extra})
    assert _path(attrs) == "generic", attrs.get("hopper_pipelines")
    lay = attrs["fragment_layouts"]
    assert lay and not [f for f, v in lay.items() if str(v).startswith("shared")], lay
    assert not [f for f, v in lay.items() if str(v).startswith("wgmma")], lay  # the sm_80 unit on both


def test_capability_overlay_plans_the_sm80_paths_on_sm90a():
    """``tilecore.capability_overlay`` (core): the sm_80 profile's units, features and limits over sm_90a give the
    general path what it gives on sm_80 (mma.sync, cp.async, FlashAttention's V not staged at 163 KiB), where
    ``disable_wgmma`` alone keeps wgmma and bulk copies; the overlay is in the cache key (the profile's hash)."""
    plain = _attrs("fa", "cuda:sm_90a", {**GENERAL, "tilecore.cuda.disable_wgmma": True})
    assert plain["fragment_layouts"]["acc_s"].startswith("wgmma") and "bulk tile copies" in plain["pipelines"][0]
    over = _attrs("fa", "cuda:sm_90a", {**GENERAL, **SM80_ON_H100})
    a80 = _attrs("fa", "cuda:sm_80", GENERAL)
    assert over["pipelines"] == a80["pipelines"] and "bulk" not in over["pipelines"][0], over["pipelines"]
    assert over["fragment_layouts"] == a80["fragment_layouts"]


def test_capability_overlay_errors_are_clear():
    from tilecore.errors import CompileError

    with pytest.raises(CompileError, match="capability_overlay must be a mapping"):
        _attrs("softmax", "cuda:sm_80", {**GENERAL, "tilecore.capability_overlay": ["limits"]})
    with pytest.raises(CompileError, match="capability_overlay: id: an overlay cannot change id"):
        _attrs("softmax", "cuda:sm_80", {**GENERAL, "tilecore.capability_overlay": {"id": "cuda/sm_90a"}})


@pytest.mark.parametrize("target,extra", [("cuda:sm_80", {}), ("cuda:sm_90a", SM80_ON_H100)])
def test_which_kernels_the_register_program_takes(target, extra):
    """The inventory's rows (D63): the register program takes the GEMM with an epilogue and both attention
    kernels; softmax and RMSNorm have no T.Pipelined loop and the 777 GEMM's B rows are not 16-byte copies."""
    taken = {n for n in mma_general.KERNELS if _path(_attrs(n, target, {**REGPROG, **extra})).startswith("register")}
    assert taken == {"gemm_epi", "fa", "fa_causal"}, taken


# -- on a GPU: every path against float64 ------------------------------------------------------------------

def _gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


gpu = pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")


def _inputs(name):
    import torch

    g = torch.Generator(device="cuda").manual_seed(7)

    def rnd(*shape, scale=1.0, dtype=torch.float16):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)

    if name == "gemm_epi":
        M, N, K = Small.gemm
        a, b, bias = rnd(M, K, scale=0.25), rnd(K, N, scale=0.25), rnd(N, dtype=torch.float32)
        return (a, b, bias), torch.relu(a.double() @ b.double() + bias.double()), 2e-2
    if name == "gemm777":
        M, N, K = Small.gemm777
        a, b = rnd(M, K, scale=0.25), rnd(K, N, scale=0.25)
        return (a, b), a.double() @ b.double(), 2e-2
    if name in ("fa", "fa_causal"):
        bb, h, s, d = Small.fa
        q, k, v = (rnd(bb, h, s, d) for _ in range(3))
        sc = (q.double() @ k.double().transpose(-1, -2)) / d ** 0.5
        if name == "fa_causal":
            sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).tril().logical_not(), float("-inf"))
        return (q, k, v), sc.softmax(-1) @ v.double(), 4e-3
    R, C = Small.rows
    x = rnd(R, C)
    xd = x.double()
    if name == "softmax":
        return (x,), xd.softmax(1), 2e-3
    return (x,), xd * (xd * xd).mean(1, keepdim=True).add(1e-6).rsqrt(), 8e-3


@gpu
@pytest.mark.parametrize("variant", ["regprog", "general", "default"])
@pytest.mark.parametrize("name", list(mma_general.KERNELS))
def test_device_every_path_matches_float64(name, variant):
    import torch

    build, own, out_idx = mma_general.KERNELS[name]
    cfg = {**NOCACHE, **mma_general.BASE, **own, **mma_general.VARIANTS[variant]}
    kern = tilecore.compile(build(Small), out_idx=out_idx, target="cuda", pass_configs=cfg)
    ins, ref, tol = _inputs(name)
    out = kern(*ins)
    torch.cuda.synchronize()
    err = (out.double() - ref).abs().max().item()
    assert err < tol, f"{name} {variant} ({tilecore_cuda.lowering_path(kern)}): max error {err}"
