"""The sm_80 (mma.sync) register program against the core's general path, decision D63.

``benchmarks/mma_general.py``'s kernels (GEMM + bias + ReLU, TileLang's FlashAttention forward causal and not,
softmax, RMSNorm, the 777-column GEMM) on ``cuda:sm_80`` and on ``cuda:sm_90a`` with
``tilecore.cuda.disable_wgmma`` (how the H100 runs the sm_80 paths): which path each takes, that the general path
holds every fragment in registers, and (on a GPU) that every path matches a float64 reference.
"""
from __future__ import annotations

import re
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
from lower_once import lower_once as lower  # noqa: E402  (D89: one lowering per distinct input)
from tilecore.errors import CompileError  # noqa: E402

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
    assert taken == {"gemm_epi", "gemm_epi_64", "gemm_epi_256", "gemm_nt", "gemm_relay", "fa", "fa_causal", "fa64",
                     "fa64_causal"}, taken


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

    if name.startswith("gemm_epi"):
        M, N, K = Small.gemm
        a, b, bias = rnd(M, K, scale=0.25), rnd(K, N, scale=0.25), rnd(N, dtype=torch.float32)
        return (a, b, bias), torch.relu(a.double() @ b.double() + bias.double()), 2e-2
    if name == "gemm_relay":
        M, N, K = Small.gemm
        a, b = rnd(M, K, scale=0.25), rnd(K, N, scale=0.25)
        return (a, b), a.double() @ b.double(), 2e-2
    if name == "gemm_nt":
        M, N, K = Small.gemm
        a, b = rnd(M, K, scale=0.25, dtype=torch.bfloat16), rnd(N, K, scale=0.25, dtype=torch.bfloat16)
        return (a, b), a.double() @ b.double().t(), 6e-2
    if name == "gemm777":
        M, N, K = Small.gemm777
        a, b = rnd(M, K, scale=0.25), rnd(K, N, scale=0.25)
        return (a, b), a.double() @ b.double(), 2e-2
    if name.startswith("fa"):
        bb, h, s, d = Small.fa
        q, k, v = (rnd(bb, h, s, d) for _ in range(3))
        sc = (q.double() @ k.double().transpose(-1, -2)) / d ** 0.5
        if name.endswith("causal"):
            sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).tril().logical_not(), float("-inf"))
        return (q, k, v), sc.softmax(-1) @ v.double(), 4e-3
    R, C = Small.rows
    x = rnd(R, C)
    xd = x.double()
    if name == "softmax":
        return (x,), xd.softmax(1), 2e-3
    return (x,), xd * (xd * xd).mean(1, keepdim=True).add(1e-6).rsqrt(), 8e-3


@gpu
@pytest.mark.parametrize("variant", ["regprog", "general", "default", "lean", "all", "general-d63", "d55"])
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


# -- D63's options on the general path -------------------------------------------------------------------------

OPTIONS = {k: v for k, v in mma_general.VARIANTS["all"].items() if k != "tilecore.cuda.register_programs"}


def _lowered(name, configs, target="cuda:sm_80", size=Small):
    build, own, _ = mma_general.KERNELS[name]
    return lower(build(size), target, {**own, **GENERAL, **configs})


def _loop_barriers(code: str, loop: str) -> int:
    """``__syncthreads()`` inside the kernel's loop over ``loop`` (its text up to the loop's closing brace)."""
    body = code[code.rindex("__global__"):]
    start = body.index(f"for (long long {loop} = 0;")
    indent = body.rindex("\n", 0, start)
    pad = start - indent - 1
    end = body.index("\n" + " " * pad + "}\n", start)
    return body[start:end].count("__syncthreads()")


def test_prune_barriers_leaves_one_barrier_a_gemm_iteration():
    """The GEMM's k loop: the planner's barrier after the wait orders everything (the stage ahead is issued after
    it, into the stage the previous iteration read); simt's barriers around the gemm go (3 -> 1)."""
    before = _lowered("gemm_epi", {"tilecore.prune_barriers": False})
    after = _lowered("gemm_epi", {"tilecore.prune_barriers": True})
    default = _lowered("gemm_epi", {})  # the CUDA plugin's default on targets without wgmma (D63)
    assert default[3].code == after[3].code
    assert _loop_barriers(before[3].code, "ko") == 3
    assert _loop_barriers(after[3].code, "ko") == 1
    assert after[2].attrs["pruned_barriers"] >= 2
    body = after[3].code[after[3].code.index("for (long long ko = 0;"):]
    assert body.index("tc_cp_async_wait<") < body.index("__syncthreads()") < body.index("tc_cp_async16(")


def test_relay_fold_stages_v_and_barriers_follow_the_waits():
    """FlashAttention at 163 KiB: O_shared folded (D63), V staged beside K (two commit groups), and with the
    barriers pruned one barrier after each of the two waits (K's at the top, V's before P @ V)."""
    plain = _lowered("fa", {"tilecore.prune_barriers": False})
    assert "V_shared" not in plain[2].attrs["pipelines"][0] and "O_shared" in plain[3].code
    on = _lowered("fa", OPTIONS)
    assert on[2].attrs["relay_tiles"] == ("O_shared",)
    assert "V_shared async 16-byte copies (issued with the stage ahead" in on[2].attrs["pipelines"][0]
    assert "O_shared" not in on[3].code
    assert _loop_barriers(on[3].code, "k") == 2 and _loop_barriers(plain[3].code, "k") >= 4
    loop = on[3].code[on[3].code.index("for (long long k = 0;"):]
    for wait in ("tc_cp_async_wait<1>();\n    __syncthreads();", "tc_cp_async_wait<2>();\n    __syncthreads();"):
        assert wait in loop
    assert "#pragma unroll" in loop


def test_relay_fold_keeps_a_tile_read_elsewhere():
    """A tile that is read by anything but a whole copy to global memory is not a relay: it stays."""
    import tilecore.language as T

    @T.prim_func
    def k(A: T.Tensor((64, 64), "float32"), B: T.Tensor((64, 64), "float32"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128) as bx:
            f = T.alloc_fragment((64, 64), "float32")
            s = T.alloc_shared((64, 64), "float32")
            T.copy(A[0, 0], f)
            T.copy(f, s)
            T.copy(s, B[0, 0])
            for i, j in T.Parallel(64, 64):
                C[i, j] = s[j, i]

    attrs = lower(k, "cuda:sm_80", {**NOCACHE, "tilecore.fold_relay_tiles": True})[2].attrs
    assert "relay_tiles" not in attrs


def _emulate():
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("the CUDA host emulator needs g++ (C++20)")
    from cuda_host_emulator import run_on_host

    return run_on_host


@pytest.mark.parametrize("name", ["gemm_epi", "softmax", "rmsnorm", "gemm777"])
def test_options_on_the_host_emulator_match_float64(name, tmp_path):
    """Every D63 option at once, the generated sm_80 source run on the host (threads concurrent, barriers real,
    cp.async landing at its wait): against float64."""
    import numpy as np

    run = _emulate()

    class Tiny:
        gemm = (256, 256, 128)
        gemm777 = (128, 200, 96)
        rows = (4, 2048)

    build, own, out_idx = mma_general.KERNELS[name]
    kern = tilecore.compile(build(Tiny), out_idx=out_idx, target="cuda:sm_80",
                            pass_configs={**own, **GENERAL, **OPTIONS})
    assert kern.meta["attrs"].get("pruned_barriers", 0) > 0
    rng = np.random.default_rng(3)
    if name.startswith("gemm"):
        M, N, K = Tiny.gemm if name == "gemm_epi" else Tiny.gemm777
        a = (rng.standard_normal((M, K)) / 4).astype(np.float16)
        b = (rng.standard_normal((K, N)) / 4).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        arrays = [a, b]
        if name == "gemm_epi":
            bias = rng.standard_normal(N).astype(np.float32)
            arrays.append(bias)
            ref = np.maximum(ref + bias, 0)
        out = run(kern, arrays + [np.zeros((M, N), np.float16)], tmp_path)[-1]
        tol = 2e-2
    else:
        R, C = Tiny.rows
        x = rng.standard_normal((R, C)).astype(np.float16)
        xd = x.astype(np.float64)
        if name == "softmax":
            e = np.exp(xd - xd.max(1, keepdims=True))
            ref = e / e.sum(1, keepdims=True)
            tol = 2e-3
        else:
            ref = xd / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-6)
            tol = 8e-3
        out = run(kern, [x, np.zeros((R, C), np.float16)], tmp_path)[-1]
    err = np.abs(out.astype(np.float64) - ref).max()
    assert err < tol, f"{name}: max error {err}"


def test_the_emulator_sees_the_one_barrier_the_gemm_loop_needs(tmp_path):
    """The mutation behind the test above: the pruned GEMM without its last loop barrier (the one after the wait)
    reads stages other threads' copies have not filled: wrong on the host emulator."""
    import dataclasses
    import types

    import numpy as np

    run = _emulate()

    class Tiny:
        gemm = (256, 256, 128)

    build, own, out_idx = mma_general.KERNELS["gemm_epi"]
    kern = tilecore.compile(build(Tiny), out_idx=out_idx, target="cuda:sm_80",
                            pass_configs={**own, **GENERAL, **OPTIONS})
    code = kern.source.code
    at = code.index("__syncthreads();", code.index("for (long long ko = 0;"))
    mutant = types.SimpleNamespace(source=dataclasses.replace(kern.source, code=code[:at] + code[at + 16:]))
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((256, 128)) / 4).astype(np.float16)
    b = (rng.standard_normal((128, 256)) / 4).astype(np.float16)
    bias = rng.standard_normal(256).astype(np.float32)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    good = run(kern, [a, b, bias, np.zeros((256, 256), np.float16)], tmp_path)[-1]
    bad = run(mutant, [a, b, bias, np.zeros((256, 256), np.float16)], tmp_path)[-1]
    assert np.abs(good.astype(np.float64) - ref).max() < 2e-2
    assert np.abs(bad.astype(np.float64) - ref).max() > 0.1


@pytest.mark.parametrize("how,gemm_loops,fa_loops", [(True, 1, 2), ("registers", 0, 1), (False, 0, 0),
                                                     ("auto", 1, 0)])
def test_unroll_matrix_steps(how, gemm_loops, fa_loops):
    """tilecore.cuda.unroll_matrix_steps: ``#pragma unroll`` right before the mma.sync k-step loops (True), only
    before those indexing a register array (FlashAttention's P @ V, whose A is P in registers), or none."""
    def pragmas(name):
        code = _lowered(name, {"tilecore.cuda.unroll_matrix_steps": how})[3].code
        body = code[code.rindex("__global__"):]
        return len(re.findall(r"#pragma unroll\n\s*for \(long long mk", body))

    assert pragmas("gemm_epi") == gemm_loops
    assert pragmas("fa") == fa_loops


def _path_of(name, target, configs):
    return _path(_attrs(name, target, {**NOCACHE, **configs}))


@pytest.mark.parametrize("forms,gemm,fa", [([], "register", "register"), (["gemm"], "generic", "register"),
                                           (["gemm", "attention"], "generic", "generic")])
def test_forms_routed_to_the_general_path(forms, gemm, fa):
    """tilecore.cuda.mma_general_forms: the mma.sync register program leaves those forms to the general path on a
    target without wgmma (the note says why); register_programs=True still forces it."""
    cfg = {"tilecore.cuda.mma_general_forms": forms}
    assert _path_of("gemm_epi", "cuda:sm_80", cfg).startswith(gemm)
    assert _path_of("fa", "cuda:sm_80", cfg).startswith(fa)
    forced = {**cfg, "tilecore.cuda.register_programs": True}
    assert _path_of("gemm_epi", "cuda:sm_80", forced).startswith("register")
    assert _path_of("fa", "cuda:sm_80", forced).startswith("register")
    if forms:
        notes = _attrs("gemm_epi", "cuda:sm_80", {**NOCACHE, **cfg})["hopper_pipelines"]
        assert any("its form (gemm) runs on the core's general path" in n for n in notes), notes


def test_forms_are_not_routed_where_the_general_path_takes_wgmma():
    """On sm_90a with disable_wgmma the general path would run wgmma: the register program keeps the kernel."""
    cfg = {"tilecore.cuda.mma_general_forms": ["gemm", "attention"], "tilecore.cuda.disable_wgmma": True}
    assert _path_of("gemm_epi", "cuda:sm_90a", cfg) == "register program (mma.sync)"


def test_forms_option_errors_are_clear():
    from tilecore.errors import CompileError

    with pytest.raises(CompileError, match="mma_general_forms='gemm': give a list of forms"):
        _attrs("gemm_epi", "cuda:sm_80", {**NOCACHE, "tilecore.cuda.mma_general_forms": "gemm"})


def test_defaults_on_sm80_route_the_gemm_form_and_flash_attention_by_shape():
    """D63's defaults on a target without wgmma: the GEMM form on the general path (k steps unrolled, barriers
    pruned); D73: FlashAttention there at 128 rows or head dimension 128 (tests/test_mma_route.py), D79: 64 rows at d64
    too, D82: 64 rows at d256; 64 rows at d192 (unmeasured) on the register program; on sm_90a with disable_wgmma
    nothing moves."""
    gemm = _attrs("gemm_epi", "cuda:sm_80", NOCACHE)
    assert _path(gemm) == "generic" and gemm["pruned_barriers"] >= 2
    assert any("its form (gemm) runs on the core's general path" in n for n in gemm["hopper_pipelines"])
    assert _path(_attrs("fa", "cuda:sm_80", NOCACHE)) == "generic"

    class D64(Small):
        fa = (2, 2, 512, 64)

    class D256(Small):
        fa = (2, 2, 512, 256)

    class D192(Small):
        fa = (2, 2, 512, 192)
    build, own, _ = mma_general.KERNELS["fa64"]
    assert _path(lower(build(D64), "cuda:sm_80", {**own, **NOCACHE})[2].attrs) == "generic"
    assert _path(lower(build(D256), "cuda:sm_80", {**own, **NOCACHE})[2].attrs) == "generic"  # D82
    assert _path(lower(build(D192), "cuda:sm_80", {**own, **NOCACHE})[2].attrs) == "register program (mma.sync)"
    assert _path(_attrs("gemm_epi", "cuda:sm_90a", {**NOCACHE, "tilecore.cuda.disable_wgmma": True})) == \
        "register program (mma.sync)"
    assert "pruned_barriers" not in _attrs("softmax", "cuda:sm_90a", NOCACHE)


# -- D68: FlashAttention on the general path at the register program's registers ------------------------------

def _host_attention_error(run, kern, composite, causal, tmp_path, seed):
    """The catalog attention kernel ``kern`` run on the host emulator with random half-precision Q, K, V: its
    largest error against the float64 reference."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (composite.HEADS, composite.SEQ, composite.DIM)
    q, k, v = (rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    out = run(kern, [q, k, v, np.zeros(shape, np.float16)], tmp_path)[3].astype(np.float64)
    return np.abs(out - composite.attention_ref([q, k, v], "float16", causal)[0]).max()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["general-d63", "general", "lean"])
def test_attention_on_the_host_emulator_matches_float64(causal, variant, tmp_path):
    """The catalog's 32x32 attention (80 keys: a ragged last block) on sm_80's general path, the generated source
    run on the host: against float64."""
    run = _emulate()
    composite = pytest.importorskip("tilecore_conformance.composite")
    kern = tilecore.compile(composite.attention("float16", causal), target="cuda:sm_80",
                            pass_configs={**NOCACHE, **mma_general.VARIANTS[variant], "tilecore.fast_math": True})
    assert _path(kern.meta["attrs"]) == "generic"
    err = _host_attention_error(run, kern, composite, causal, tmp_path, seed=11)
    assert err <= 2e-3, f"{variant} causal={causal}: max error {err}"


def _loop_text(code: str, loop: str) -> str:
    body = code[code.rindex("__global__"):]
    start = body.index(f"for (long long {loop} = 0;")
    pad = start - body.rindex("\n", 0, start) - 1
    return body[start:body.index("\n" + " " * pad + "}\n", start)]


@pytest.mark.parametrize("pairs", [True, False])
def test_ldmatrix_pairs(pairs):
    """tilecore.cuda.ldmatrix_pairs (D68, default True): two B atoms of one k step by one ldmatrix .x4 (lanes 16-31
    address the second atom), as the register program loads them; False keeps one .x2 an atom. FlashAttention's
    Q K^T (B = K stored (N, K): plain) and P @ V (B = V stored (K, N): .trans), 16 n8 atoms each."""
    cfg = {} if pairs else {"tilecore.cuda.ldmatrix_pairs": False}
    loop = _loop_text(_lowered("fa", cfg, size=Small)[3].code, "k")
    for arr, trans in (("acc_s_mma_b", "false"), ("acc_o_mma_b", "true")):
        x4 = len(re.findall(rf"tc_ldsm_regs<4, {trans}>\(&{arr}\[(\d+)\]", loop))
        x2 = len(re.findall(rf"tc_ldsm_regs<2, {trans}>\(&{arr}\[(\d+)\]", loop))
        assert (x4, x2) == ((8, 0) if pairs else (0, 16)), (arr, x4, x2)
    # the GEMM form too (B's atoms 16 columns apart there: 2 x 4 warps over 128 x 128)
    gemm = _loop_text(_lowered("gemm_epi", cfg, size=Small)[3].code, "ko")
    assert len(re.findall(r"tc_ldsm_regs<4, true>\(&C_local_mma_b", gemm)) == (4 if pairs else 0)


def test_index_shifts_on_mma_sync_launches():
    """tilecore.cuda.nonnegative_index_shifts "auto" (D68): in a launch of mma.sync k steps on a target without wgmma
    the loops' floor divisions and remainders by powers of two of nonnegative values are shifts and masks (the
    64-bit signed sequences of the ldmatrix addresses held FlashAttention's registers); False keeps them."""
    def loads(cfg):  # the k loop's ldmatrix lines
        loop = _loop_text(_lowered("fa", cfg, size=Small)[3].code, "k")
        return "\n".join(x for x in loop.splitlines() if "tc_ldsm_regs<" in x)

    on, off = loads({}), loads({"tilecore.cuda.nonnegative_index_shifts": False})
    assert on.count("tc_ldsm_regs<") == 17 and "tc_floormod(" not in on and "tc_floordiv(" not in on
    assert off.count("tc_floormod(") > 100


@needs_toolchain
@pytest.mark.parametrize("name", ["fa", "fa_causal", "fa64", "fa64_causal"])
def test_flash_attention_general_path_registers(name):
    """ptxas on sm_80 (D68): FlashAttention on the general path at b8 h32 s4096 d128 holds no stack and no spills,
    at most the register program's registers (232 / 246 / 168 / 210 with NVRTC 13.0); before D68 (the shifts off, B
    by .x2) the 128x128 kernels kept a 128-byte stack (P in local memory: its P @ V k steps rolled)."""
    class Big(Small):
        fa = (8, 32, 4096, 128)

    build, own, out_idx = mma_general.KERNELS[name]
    regs = {}
    for var in ("regprog", "general"):
        kern = tilecore.compile(build(Big), out_idx=out_idx, target="cuda:sm_80",
                                pass_configs={**NOCACHE, **own, **mma_general.VARIANTS[var]})
        rep = kern.source.meta["ptxas"]
        if rep.get("reported") is False:
            pytest.skip("this toolchain returned no ptxas report")
        regs[var] = rep["registers"]
        assert rep.get("stack", 0) == 0 and rep.get("spill_stores", 0) == 0, (var, rep)
    assert regs["general"] <= regs["regprog"], regs
    if name in ("fa", "fa_causal"):
        before = tilecore.compile(build(Big), out_idx=out_idx, target="cuda:sm_80",
                                  pass_configs={**NOCACHE, **own, **mma_general.VARIANTS["general-d63"]})
        assert before.source.meta["ptxas"].get("stack", 0) > 0


# -- D71: the later copy's issue and wait (tilecore.pipeline_late_copy) ---------------------------------------

LATE = mma_general.LATE


def _k_loop(code: str) -> str:
    return _loop_text(code, "k")


def _events(loop: str) -> list:
    """The k loop's copy events in order: ('wait', n), 'bar', 'V' / 'K' (a cp.async of that tile), 'commit',
    'S' / 'O' (the first mma.sync of Q K^T / P @ V)."""
    out = []
    for line in loop.splitlines():
        if m := re.search(r"tc_cp_async_wait<(\d+)>", line):
            out.append(("wait", int(m.group(1))))
        elif "__syncthreads()" in line:
            out.append("bar")
        elif "tc_cp_async_commit()" in line:
            out.append("commit")
        elif m := re.search(r"tc_cp_async16\((\w)_shared", line):
            if not out or out[-1] != m.group(1):
                out.append(m.group(1))
        elif "tc_mma_16816_r(&acc_s[0]," in line:
            out.append("S")
        elif "tc_mma_16816_r(&acc_o[0]," in line:
            out.append("O")
    return out


def test_late_copy_issues_v_at_the_top_single_buffered():
    """FlashAttention 128x128 d128 on sm_80's general path (V unstaged at 163 KiB with O_shared): D68's loop issues V
    after the softmax and waits for it with K's stage ahead; tilecore.pipeline_late_copy=True issues it right after
    the barrier that frees its buffer, before K's stage ahead, and waits for it alone (wait_group 1) before P @ V;
    "joint" waits for both there. Two block barriers an iteration each (V has one buffer)."""
    before = _events(_k_loop(_lowered("fa", {})[3].code))
    assert before == [("wait", 0), "bar", "K", "commit", "S", "V", "commit", ("wait", 0), "bar", "O"], before
    for how, wait in ((True, 1), ("joint", 0)):
        low = _lowered("fa", {LATE: how})
        ev = _events(_k_loop(low[3].code))
        assert ev == [("wait", 0), "bar", "V", "commit", "K", "commit", "S", ("wait", wait), "bar", "O"], (how, ev)
        note = low[2].attrs["pipelines"][0]
        assert "V_shared (one buffer) issued at the top of the iteration after the barrier that frees it" in note
    # the IR dump shows the schedule: the note as the function's attribute, the waits as statements
    from tilecore.ir.printer import func_str
    ir = func_str(_lowered("fa", {LATE: True})[2])
    assert "# attr pipelines = ('loop k: 2 stages" in ir and "T.async_wait(pending=1)" in ir
    assert ("iteration: wait(0) ; barrier ; copy V_shared ; commit ; copy K_shared ; commit ; ... ; gemm ; ... ; "
            "wait(1) ; barrier ; gemm") in ir


@pytest.mark.parametrize("name,d", [("fa64", 64), ("fa", 128)])
def test_late_copy_waits_for_a_staged_v_at_the_top(name, d):
    """V staged (64x64 d64: both fit; 128x128 d128 with the relay fold): D68's loop waits for V where it stands
    (two waits, two barriers an iteration); with the option, one wait for stage k's K and V at the top and one
    barrier an iteration (the register program's schedule)."""
    class Size(Small):
        fa = (2, 2, 512, d)

    extra = {} if name == "fa64" else {"tilecore.fold_relay_tiles": True}
    before = _events(_k_loop(_lowered(name, extra, size=Size)[3].code))
    assert before.count("bar") == 2 and [e for e in before if isinstance(e, tuple)] == [("wait", 1), ("wait", 2)], \
        before
    low = _lowered(name, {**extra, LATE: True}, size=Size)
    ev = _events(_k_loop(low[3].code))
    assert ev == [("wait", 0), "bar", "K", "commit", "V", "commit", "S", "O"], ev
    note = low[2].attrs["pipelines"][0]
    assert "waited for with the leading copies at the top of the iteration" in note
    assert note.endswith("iteration: wait(0) ; barrier ; copy K_shared ; commit ; copy V_shared ; commit ; ... ; "
                         "gemm ; ... ; gemm"), note


def test_late_copy_option_errors_and_bulk_targets():
    """A clear error for a value the option does not take; on sm_90a (bulk tile copies, FlashAttention's rotated,
    warp-specialized loop) the option changes nothing."""
    with pytest.raises(CompileError, match="tilecore.pipeline_late_copy='top'.*False.*True.*'joint'"):
        _lowered("fa", {LATE: "top"})
    base = {"tilecore.cuda.register_programs": False}
    build, own, _ = mma_general.KERNELS["fa"]
    a = lower(build(Small), "cuda:sm_90a", {**NOCACHE, **own, **base})[3].code
    b = lower(build(Small), "cuda:sm_90a", {**NOCACHE, **own, **base, LATE: True})[3].code
    assert a == b


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("how,stages,per_sm", [(True, 2, 14336), ("joint", 2, 14336), (True, 3, 16384),
                                               ("joint", 3, 16384), (True, 2, None), (True, 3, None)])
def test_late_copy_on_the_host_emulator_matches_float64(how, stages, per_sm, causal, tmp_path):
    """The catalog's 32x32 attention (80 keys: a ragged last block), 2 and 3 stages, V unstaged (a per-SM shared
    memory limit through the capability overlay makes the occupancy rule refuse its stages: the copy issued at the
    top of the iteration, the prologue's empty groups keeping the wait counts) and staged (one wait at the top):
    the generated sm_80 source run on the host (threads concurrent, barriers real, cp.async landing at its wait)
    against float64."""
    run = _emulate()
    composite = pytest.importorskip("tilecore_conformance.composite")
    c = composite
    f = c.flash_attention_forward(c.SEQ, c.DIM, c.HEADS, c.BM, c.BN, "float16", causal, num_stages=stages)
    cfg = {**NOCACHE, **GENERAL, "tilecore.fast_math": True, LATE: how}
    if per_sm is not None:
        cfg["tilecore.capability_overlay"] = {"limits.max_shared_bytes_per_sm.value": per_sm}
    kern = tilecore.compile(f, target="cuda:sm_80", pass_configs=cfg)
    note = kern.meta["attrs"]["pipelines"][0]
    assert f"{stages} stages" in note
    assert ("(one buffer) issued at the top" in note) == (per_sm is not None), note
    err = _host_attention_error(run, kern, c, causal, tmp_path, seed=5)
    assert err <= 2e-3, f"{how} {stages} stages causal={causal}: max error {err}"


def device_attention_error(name, d, configs) -> tuple:
    """``(max error against float64, tolerance, the kernel)``: FlashAttention kernel ``name`` of the benchmark at b2
    h2 s512, head dimension ``d``, built for the device with the sm_80 profile overlaid (``mma_general.BASE``), the
    kernel's own configs and ``configs``, run on :func:`_inputs`' data (the D71 and D73 / D79 device tests share it)."""
    import torch

    class Size(Small):
        fa = (2, 2, 512, d)

    build, own, out_idx = mma_general.KERNELS[name]
    cfg = {**NOCACHE, **mma_general.BASE, **own, **configs}
    kern = tilecore.compile(build(Size), out_idx=out_idx, target="cuda", pass_configs=cfg)
    old, Small.fa = Small.fa, Size.fa
    try:
        ins, ref, tol = _inputs(name)
    finally:
        Small.fa = old
    out = kern(*ins)
    torch.cuda.synchronize()
    return (out.double() - ref).abs().max().item(), tol, kern


@gpu
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("variant", ["late", "late-joint", "fold-late", "late-d55", "late-staged", "lean-late"])
@pytest.mark.parametrize("name", ["fa", "fa_causal", "fa64", "fa64_causal"])
def test_device_late_copy_matches_float64(name, variant, d):
    """D71's rows on the device (the sm_80 paths through the overlay) against float64, d128 and d64."""
    err, tol, kern = device_attention_error(name, d, mma_general.VARIANTS[variant])
    assert err < tol, f"{name} d{d} {variant} ({tilecore_cuda.lowering_path(kern)}): max error {err}"
