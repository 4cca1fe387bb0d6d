"""FlashAttention forward on the core's general path (``tilecore.cuda.register_programs=False``), decision D55.

The benchmark's kernel (``tilecore_conformance.composite.flash_attention_forward``) at 128x128 (256 threads) and
64x64 (128 threads), with D55's options each alone and all together:

- ``tilecore.pipeline_no_drain``: no drain after a loop whose count is not a constant (the causal loop's
  ``bx + 1``): ptxas no longer serializes the wgmma instructions (its performance remark is the test);
- ``tilecore.prune_condition_binds``: the mask's named condition ``valid = k * bn + j < seq`` drops what the
  prover shows, so the non-causal loop has no select on the scores;
- ``tilecore.store_cast_once``: P's cast to float16 is one conversion a pair (F2FP), no round trip (HADD2);
- ``tilecore.cuda.uniform_warp_index``: the wgmma descriptors' warpgroup term from a warp-uniform value (no
  R2UR moves in the main loop);
- ``tilecore.pipeline_early_issue``: the block barrier and the stage issue right after S = Q K^T's wait, K two
  stages ahead with two buffers;
- ``tilecore.split_masked_iterations``: the causal mask left out of the iterations before the diagonal
  (``if k < E``: the nest without it);
- ``tilecore.pingpong`` (with ``tilecore.warp_specialize``): the two consumer warpgroups take turns issuing
  their gemms.

Compile-only checks wherever a CUDA compiler exists (CI): notes, source, SASS (HGMMA, UTMALDG, no local
memory). On an sm_90 GPU every variant runs against a float64 reference, causal and not, with a ragged
sequence (the bulk copies' zero fill and the sequence-edge mask).
"""
from __future__ import annotations

import collections
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import GENERAL, HOPPER, hopper_gpu  # noqa: E402

#: D89: the general path through the run's kernel cache (conftest: private to the run, shared by its xdist workers;
#: keyed by the IR, options and the core's and plugin's code), so that a kernel that several tests read compiles
#: once: test_cuda_hopper's GENERAL without its tilecore.disable_cache. The tests that monkeypatch the route's tables
#: compile with NOCACHE (``_routed`` and theirs): a patched compile neither reads nor writes the cache.
GENERAL = {k: v for k, v in GENERAL.items() if k != "tilecore.disable_cache"}

import tilecore  # noqa: E402
from tilecore_conformance.composite import flash_attention_forward  # noqa: E402

#: D55's options, by the name the benchmark's --general takes (benchmarks/cuda_attention.py GENERAL)
OPTIONS = {
    "nodrain": {"tilecore.pipeline_no_drain": True},
    "prune": {"tilecore.prune_condition_binds": True},
    "cast": {"tilecore.store_cast_once": True},
    "uniform": {"tilecore.cuda.uniform_warp_index": True},
    "early": {"tilecore.pipeline_early_issue": True},
    "split": {"tilecore.split_masked_iterations": True},
}
#: on by default since the H100 measured them (round 1 of D55); the rest stay asked for
DEFAULT_ON = ("nodrain", "prune", "cast", "early", "split")
ALL = {k: v for o in OPTIONS.values() for k, v in o.items()}
#: D59's options off (on by default since the device measured them: the producer warpgroup with ping-pong for
#: FlashAttention's form, the rotated body, P pinned; the uniform warp index where a gemm reads registers)
D59_OFF = {"tilecore.cuda.fence_register_operands": False, "tilecore.pipeline_overlap": False,
           "tilecore.warp_specialize": False, "tilecore.pingpong": False,
           "tilecore.pipeline_mask_after_gemm": False, "tilecore.cuda.nonnegative_index_shifts": False}
#: every option off: the general path before D55 (several are on by default since the H100 measured them)
OFF = {k: False for k in ALL} | {"tilecore.pipeline_no_drain": False} | D59_OFF
#: the producer warpgroup (D29) with the two consumer warpgroups taking turns on the tensor cores (D55)
PINGPONG = {**{k: v for n, o in OPTIONS.items() if n != "early" for k, v in o.items()},
            "tilecore.warp_specialize": True, "tilecore.pingpong": True,
            "tilecore.cuda.fence_register_operands": False, "tilecore.pipeline_overlap": False,
            "tilecore.cuda.nonnegative_index_shifts": False}  # (D59's off)
TILES = {"128x128": (128, 128, 256), "64x64": (64, 64, 128)}


def fa(seq, dim, heads, tile, causal, batch=None, **configs):
    bm, bn, threads = TILES[tile]
    func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=threads)
    return tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **configs})


def bench(tile, causal, **configs):
    """The benchmark's shape (b8 h32 s4096 d128), every D55 option off but those given."""
    return fa(4096, 128, 32, tile, causal, batch=8, **{**OFF, **configs})


def _compile_warnings(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        k = fn()
    return k, [str(w.message) for w in got]


def _ops(k) -> collections.Counter:
    """The kernel's SASS opcodes, counted."""
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    return collections.Counter(sass_paths.opcode(t) for _, t in sass_paths.parse(sass))


def _loop_counts(k) -> list:
    """(per path through the main loop, its opcode counts; the kernel's) for the non-causal kernels (a causal
    kernel's division epilogue branches back into the loop's address range: sass_paths would take it for it)."""
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    ins = sass_paths.parse(sass)
    idx = sass_paths.main_loop(ins, 8)
    return [c for _, c in sass_paths.paths(ins, idx)], collections.Counter(sass_paths.opcode(t) for _, t in ins)


SERIALIZED = "serialized"


@needs_toolchain
@pytest.mark.parametrize("tile", sorted(TILES))
def test_the_causal_loop_without_a_drain_is_not_serialized(tile):
    # D61's row division and bulk store off too: with either ptxas (NVRTC 13.0) no longer serializes the drained loop's
    # wgmma
    k0, before = _compile_warnings(lambda: bench(tile, True, **ROWDIV_OFF, **DIRECT))
    if not any(SERIALIZED in w for w in before):
        # the premise is ptxas's report (here, CI: it names the drained loop's serialized wgmma); on the GPU hosts NVRTC
        # gave ptxas's lines only for a run's first compile of a program (the report says {"reported": False}; the
        # tenth session's probe), and there only the option's own effects below are checked
        assert k0.source.meta["ptxas"].get("reported") is False, "the drain no longer serializes: the option tests nothing"
    k, after = _compile_warnings(lambda: bench(tile, True, **OPTIONS["nodrain"], **ROWDIV_OFF, **DIRECT))
    assert not any(SERIALIZED in w for w in after), after
    src = k.get_kernel_source()
    loop_at = src.index("for (long long k = 0; k < loop; ++k)")
    assert "tc_wg_wait<0>" in src[loop_at:]  # the last iteration waits for its own gemm
    ops = _ops(k)
    assert ops["HGMMA"] > 0 and ops["LDL"] + ops["STL"] == 0


@needs_toolchain
def test_a_named_mask_condition_the_prover_shows_folds():
    off = bench("128x128", False)
    on = bench("128x128", False, **OPTIONS["prune"])
    assert "valid = (((k * 128)" in off.get_kernel_source()
    assert "valid = (((k * 128)" not in on.get_kernel_source()
    (c_off, *_), _ = _loop_counts(off)
    (c_on, *_), _ = _loop_counts(on)
    assert c_on["FSEL"] < c_off["FSEL"] and sum(c_on.values()) < sum(c_off.values()) - 60
    # causal: the diagonal's test stays (the prover cannot show it)
    assert "valid" in bench("128x128", True, **OPTIONS["prune"]).get_kernel_source()


@needs_toolchain
def test_the_probabilities_cast_once_a_pair():
    (c_off, *_), _ = _loop_counts(bench("128x128", False))
    (c_on, *_), _ = _loop_counts(bench("128x128", False, **OPTIONS["cast"]))
    # 64 scores a thread: 32 pairs, one F2FP each; before: a conversion, a round trip back (HADD2), the pair
    assert c_on["F2FP"] == 32 and c_on["HADD2"] == 0
    assert c_off["F2FP"] > 32 and c_off["HADD2"] > 0


@needs_toolchain
def test_the_descriptors_take_the_warpgroup_from_a_warp_uniform_value():
    k = bench("128x128", False, **OPTIONS["uniform"])
    assert "const int tc_warp_u = __shfl_sync(0xffffffffu, ((int)threadIdx.x) >> 5, 0);" in k.get_kernel_source()
    (c_on, *_), _ = _loop_counts(k)
    (c_off, *_), _ = _loop_counts(bench("128x128", False))
    assert c_off["R2UR"] > 0 and c_on["R2UR"] == 0
    # a GEMM's descriptors are left as they were without the option (no declaration)
    assert "tc_warp_u" not in bench("128x128", False).get_kernel_source()


@needs_toolchain
def test_k_is_issued_two_stages_ahead_after_the_first_gemm():
    k = bench("128x128", False, **OPTIONS["early"])
    note = k.meta["attrs"]["pipelines"][0]
    assert "issued after the first gemm's wait (K_s 2 stages ahead)" in note, note
    src = k.get_kernel_source()
    body = src[src.index("for (long long k = 0; k < 32; ++k)"):]
    first_wait = body.index("tc_wg_wait<0>")
    sync = body.index("__syncthreads();")
    assert first_wait < sync < body.index("(k + 2) < 32") < body.index("(k + 1) < 32") < body.index("tc_wg_wait<1>")
    # the prologue issues K's stages 0 and 1 and V's stage 0
    head = src[:src.index("for (long long k = 0; k < 32; ++k)")]
    assert head.count("tc_mbar_expect_tx(tc_smem_addr(K_s_full") == 2 and head.count("V_s_full + (0)), 32768u") == 1
    _, ops = _loop_counts(k)
    assert ops["UTMALDG"] >= 6 and ops["LDL"] + ops["STL"] == 0
    # without the option: one issue point at the end, one stage ahead
    off = bench("128x128", False).meta["attrs"]["pipelines"][0]
    assert "issued after the first gemm's wait" not in off


@needs_toolchain
def test_a_body_with_one_gemm_keeps_its_issue_point():
    # the 64x64 tile keeps V where it stands (occupancy): one staged group, K, read only by S = Q K^T; P @ V reads
    # a tile copied in the body, so the first gemm's wait is still a point where every gemm is done
    k = bench("64x64", False, **OPTIONS["early"])
    note = k.meta["attrs"]["pipelines"][0]
    assert "K_s 2 stages ahead" in note, note


@needs_toolchain
@pytest.mark.parametrize("tile", sorted(TILES))
def test_the_causal_mask_is_left_out_before_the_diagonal(tile):
    bm, bn, _ = TILES[tile]
    k = bench(tile, True, **OPTIONS["split"], **OPTIONS["nodrain"])
    src = k.get_kernel_source()
    # the iterations k < floor((bx bm - bn + 1) / bn) + 1 hold the whole mask (capped by the sequence's edge)
    assert f"if ((k < tc_min({4096 // bn}, (tc_floordiv(((bx * {bm}) + (-{bn - 1})), {bn}) + 1))))" in src
    # the unmasked branch stores zeros (no select), the masked one keeps the selects
    loop = src[src.index("for (long long k = 0; k < loop; ++k)"):]
    then, orelse = loop.split("} else {", 1)
    masked = orelse.split("tc_wg_fence")[0]
    assert "acc_s[0] = 0.0f;" in then and "? 0.0f : (-INFINITY));" not in then
    assert masked.count("? 0.0f : (-INFINITY));") == bm * bn // TILES[tile][2]
    # no split without the option, nor where no mask holds for whole iterations (the non-causal kernel with
    # its edge test pruned away has none left)
    assert "if ((k < tc_min(" not in bench(tile, True).get_kernel_source()


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_the_two_consumer_warpgroups_take_turns_issuing_their_gemms(causal):
    k, warns = _compile_warnings(lambda: bench("128x128", causal, **PINGPONG))
    assert not any(SERIALIZED in w for w in warns), warns
    note = k.meta["attrs"]["pipelines"][0]
    assert "warp-specialized" in note and "ping-pong: the 2 consumer groups take turns" in note, note
    src = k.get_kernel_source()
    body = src[src.index("for (long long k = 0; k < loop; ++k)" if causal else "for (long long k = 0; k < 32; ++k)"):]
    # each gemm: the turn taken after the opening fence, passed right after the commit, before any wait
    take, give = "tc_named_sync(2 + (tc_warp_u / 4), 256);", "tc_named_arrive(2 + ((tc_warp_u / 4) ^ 1), 256);"
    assert body.count(take) == 2 and body.count(give) == 2
    first = body.index(take)
    assert body.index("tc_wg_fence();") < first < body.index("tc_wg_commit();") < body.index(give) \
        < body.index("tc_wg_wait<0>")
    # the first turn is given before the loop (the second group arrives on the first's barrier), the last taken
    # back after it: every arrival matched
    head, tail = src[:src.index(body[:40])], body
    assert "if ((tc_warp_u / 4) == 1) tc_named_arrive(2, 256);" in head
    assert "if ((tc_warp_u / 4) == 0) tc_named_sync(2, 256);" in tail
    ops = _ops(k)
    assert ops["LDL"] + ops["STL"] == 0 and ops["HGMMA"] >= 16
    # with the early issue, each copy group has its own `empty` barrier, released right after S = Q K^T's wait
    # (K this iteration's stage, V the previous one's), and the producer waits for each group's own release
    early = bench("128x128", causal, **PINGPONG, **OPTIONS["early"])
    assert "each group's stage released after the first gemm's wait" in early.meta["attrs"]["pipelines"][0]
    e_src = early.get_kernel_source()
    e_body = e_src[e_src.index("tc_named_arrive(2 + ((tc_warp_u / 4) ^ 1), 256);"):]
    assert e_body.index("tc_wg_wait<0>") < e_body.index("tc_mbar_arrive(tc_smem_addr(K_s_empty") \
        < e_body.index("tc_mbar_arrive(tc_smem_addr(V_s_empty") < e_body.index("V_s_full")
    producer = e_src[:e_src.index("setmaxnreg.inc")]
    assert producer.index("tc_mbar_wait(tc_smem_addr(K_s_empty") < producer.index("tc_mbar_wait(tc_smem_addr(V_s_empty")
    assert "V_s_empty" not in src  # without it: one barrier for both groups, released at the end
    # one consumer warpgroup (64x64): nothing to take turns with
    one = bench("64x64", causal, **PINGPONG)
    assert "ping-pong" not in one.meta["attrs"]["pipelines"][0] and "tc_named_" not in one.get_kernel_source()


@needs_toolchain
def test_the_measured_options_are_the_defaults():
    default = fa(4096, 128, 32, "128x128", True, batch=8)
    d55 = {k: v for n in DEFAULT_ON for k, v in OPTIONS[n].items()}
    # D59: FlashAttention's form with the producer warpgroup, ping-pong, the rotated body, P pinned and the
    # uniform warp index (a gemm reads registers)
    d59 = {**OPTIONS["uniform"], "tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
           "tilecore.warp_specialize": True, "tilecore.pingpong": True, "tilecore.pipeline_mask_after_gemm": True,
           "tilecore.cuda.nonnegative_index_shifts": True}
    asked = fa(4096, 128, 32, "128x128", True, batch=8, **d55, **d59)
    assert default.get_kernel_source() == asked.get_kernel_source()
    assert default.get_kernel_source() != bench("128x128", True).get_kernel_source()
    assert "the last gemm one iteration late" in default.meta["attrs"]["pipelines"][0]
    # one consumer warpgroup (64x64, V not staged): no producer warpgroup, as before D59
    small = fa(4096, 128, 32, "64x64", True, batch=8)
    assert "warp-specialized" not in small.meta["attrs"]["pipelines"][0]
    # a GEMM (no gemm reading registers): no uniform warp index, no producer warpgroup
    from test_general_gemm import gemm

    g = tilecore.compile(gemm(512, 512, 256), target=HOPPER, pass_configs=GENERAL)
    assert "tc_warp_u" not in g.get_kernel_source() and "setmaxnreg" not in g.get_kernel_source()
    plain = tilecore.compile(gemm(512, 512, 256), target=HOPPER,
                             pass_configs={**GENERAL, "tilecore.cuda.nonnegative_index_shifts": False})
    assert plain.get_kernel_source() == g.get_kernel_source()  # the shifts only where a gemm reads registers


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile", sorted(TILES))
def test_all_options_compile_without_spills(tile, causal):
    k, warns = _compile_warnings(lambda: bench(tile, causal, **ALL))
    assert not any(SERIALIZED in w for w in warns), warns
    ops = _ops(k)
    assert ops["HGMMA"] >= 12 and ops["UTMALDG"] > 0 and ops["LDL"] + ops["STL"] == 0


@needs_toolchain
def test_the_catalog_attention_cases_compile_on_the_general_path_with_every_option():
    from tilecore_conformance.composite import attention, attention_tile

    for build in (attention, attention_tile):  # (the tile: 64 query rows a warpgroup, wgmma)
        for causal in (False, True):
            k = tilecore.compile(build("float16", causal), target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **ALL})
            sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
            assert "tc_kernel" in sass and "LDL" not in sass
            if build is attention_tile:
                assert "HGMMA" in sass


# -- on an sm_90 GPU ---------------------------------------------------------------------------------------

def _reference(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v in float64 on the tensors' device (a single K / V head broadcasts over Q's)."""
    from tilelang_corpus._driver import attention_ref

    return attention_ref(q, k, v, causal)


@hopper_gpu
@pytest.mark.parametrize("variant", sorted(OPTIONS) + ["all", "none", "pingpong"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile", sorted(TILES))
def test_general_path_attention_matches_float64(tile, causal, variant):
    import torch

    seq, dim, heads, batch = 456, 128, 3, 2  # a ragged last block for both tiles
    configs = {"all": ALL, "none": OFF, "pingpong": PINGPONG, **OPTIONS}[variant]
    kern = fa(seq, dim, heads, tile, causal, batch=batch, **configs)
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    out = kern(q, k, v)
    torch.cuda.synchronize()
    ref = _reference(q, k, v, causal)
    err = (out.double() - ref).abs().max().item()
    assert err < 2e-3, f"{tile} causal={causal} {variant}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_early_issue_and_no_drain_give_the_same_bits(causal):
    """Every option of D55 (all together) leaves the exact build's outputs bit for bit: they move, prune or
    convert once, they change no arithmetic."""
    import torch

    seq, dim, heads, batch = 512, 128, 2, 2
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    base = fa(seq, dim, heads, "128x128", causal, batch=batch, **OFF)(q, k, v)
    moved = fa(seq, dim, heads, "128x128", causal, batch=batch, **ALL)(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(base, moved)


# -- D59: toward the register program ----------------------------------------------------------------------

#: D59's options, by name (benchmarks/cuda_attention.py GENERAL's fence / overlap / pp_* rows), each with the ones
#: before it where it needs them (the rotated body pins P across the back edge with the fence)
D59 = {"fence": {"tilecore.cuda.fence_register_operands": True},
       "overlap": {"tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True},
       "desc": {"tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
                "tilecore.cuda.descriptor_offsets": True},
       "all": {"tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
               "tilecore.cuda.descriptor_offsets": True, "tilecore.cuda.nonnegative_index_shifts": True},
       "mask": {"tilecore.cuda.fence_register_operands": True, "tilecore.pipeline_overlap": True,
                "tilecore.pipeline_mask_after_gemm": True,
                "tilecore.pipeline_mask_unswitch": False}}  # (D70's unswitched iteration off: D59's form)
WS = {"tilecore.warp_specialize": True}
PP = {**WS, "tilecore.pingpong": True}


def cfg(*dicts) -> dict:
    """The dicts merged, later keys winning."""
    return {k: v for d in dicts for k, v in d.items()}
#: the benchmark's early row (D55's options, the uniform warp index included), D59's off
EARLY = {**ALL, **D59_OFF}


def _pv_hgmma(k) -> list:
    """The SASS text of P @ V's HGMMA (A from registers: ``R.., gdesc[..].tnspB``), in address order."""
    sass = tilecore_cuda.CUDABackend().disassemble(k.binary, k.target)
    return [t for _, t in sass_paths.parse(sass) if sass_paths.opcode(t) == "HGMMA" and ".tnspB" in t
            and "gdesc" in t.split(",")[2]]


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_p_is_pinned_before_the_fence_so_p_at_v_is_one_wgmma_group(causal):
    """Without the option, nvcc sinks P's conversions past the gemm's wgmma.fence, between the instructions,
    and ptxas fences and closes a group before each (gsb0 on every one of P @ V's 8 HGMMA). With it, P's
    registers are pinned before the fence: one group (gsb0 on the last), one WARPGROUP.ARRIVE for the gemm."""
    off = bench("128x128", causal, **EARLY)
    on, warns = _compile_warnings(lambda: bench("128x128", causal, **cfg(EARLY, D59["fence"])))
    assert "tc_wg_fence_pairs<64>(acc_s_cast);" in on.get_kernel_source()
    assert "tc_wg_fence_pairs" not in off.get_kernel_source()
    pv_off, pv_on = _pv_hgmma(off), _pv_hgmma(on)
    assert len(pv_on) == len(pv_off) and len(pv_on) and len(pv_on) % 8 == 0  # 8 k steps of 16 per copy of the gemm
    assert all(t.endswith("gsb0") for t in pv_off)  # the premise: each its own group
    assert [t.endswith("gsb0") for t in pv_on] == ([False] * 7 + [True]) * (len(pv_on) // 8)
    ops_on, ops_off = _ops(on), _ops(off)
    assert ops_on["WARPGROUP"] < ops_off["WARPGROUP"]
    assert ops_on["LDL"] + ops_on["STL"] == 0
    assert not any(SERIALIZED in w for w in warns), warns


@needs_toolchain
def test_the_operand_fence_leaves_a_gemm_without_register_operands_alone():
    from test_general_gemm import gemm

    func = gemm(512, 512, 256)  # A and B from shared tiles by descriptor
    plain = tilecore.compile(func, target=HOPPER, pass_configs=GENERAL).get_kernel_source()
    fenced = tilecore.compile(func, target=HOPPER, pass_configs={**GENERAL, **D59["fence"]}).get_kernel_source()
    assert "wgmma" in plain and plain == fenced


def _rotated_loop(src: str) -> str:
    """The text of the rotated main loop (from its ``for`` to its closing brace)."""
    at = src.index("for (long long k = 1; k < ")
    depth, i = 0, src.index("{", at)
    while True:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        if depth == 0:
            return src[at:i + 1]
        i += 1


def _rotated_order(src: str) -> list:
    """The order of the rotated loop's synchronizations in a kernel's source, from its main loop's first line."""
    marks = {"K wait": "tc_mbar_wait(tc_smem_addr(K_s_full", "V wait": "tc_mbar_wait(tc_smem_addr(V_s_full",
             "S commit": "tc_wg_commit();\n", "wait 1": "tc_wg_wait<1>();", "wait 0": "tc_wg_wait<0>();",
             "P@V": "tc_wgmma_rs_", "S": "tc_wgmma_f16_n128_t0::run", "rescale": "acc_o[0] = (acc_o[0] * scale[0]);",
             "exp": "acc_s[0] = exp2f(", "pin": "tc_wg_pin_pairs<64>("}
    body = _rotated_loop(src)
    found = sorted((body.index(m), name) for name, m in marks.items() if m in body)
    return [name for _, name in found]


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", ["thread0", "pingpong"])
def test_the_rotated_body_issues_s_and_the_previous_p_at_v_together(causal, form):
    """tilecore.pipeline_overlap: iteration 0 peeled, the loop from 1: V's previous stage waited for, S = Q K^T
    and the previous iteration's P @ V issued (with ping-pong in one turn), S waited for alone (wait<1>), the
    exponentials, the wait for both, O's rescale, P pinned for the next iteration; the last P @ V after the loop.
    Without the option the loop starts at 0 and each gemm has its own turn."""
    extra = PP if form == "pingpong" else {}
    k, warns = _compile_warnings(lambda: bench("128x128", causal, **cfg(EARLY, extra, D59["overlap"])))
    src = k.get_kernel_source()
    note = k.meta["attrs"]["pipelines"][0]
    assert "the last gemm one iteration late" in note, note
    order = _rotated_order(src)
    assert order[:3] == ["K wait", "V wait", "S"] and order.index("P@V") < order.index("wait 1") < order.index("exp") \
        < order.index("wait 0") < order.index("rescale") < order.index("pin"), order
    if form == "pingpong":
        loop = _rotated_loop(src)
        # one turn an iteration: taken after S's fence, passed after P @ V's commit
        assert loop.count("tc_named_sync(2 + ") == 1 and loop.count("tc_named_arrive(2 + ") == 1
        assert loop.index("tc_wgmma_f16_n128_t0") > loop.index("tc_named_sync(2 + ")
        assert loop.index("tc_named_arrive(2 + ") > loop.rindex("tc_wgmma_rs_")
    # the last P @ V after the loop waits for itself
    loop = _rotated_loop(src)
    tail = src[src.index(loop) + len(loop):]
    assert "tc_wg_wait<0>(); tc_wg_fence_regs<64>(acc_o);" in tail and "tc_wgmma_rs_" in tail
    # P carried across the back edge as the packed pairs the instruction reads
    assert "tc_wg_pin_pairs<64>(acc_s_cast, acc_s_cast_pk);" in loop and "tc_wg_unpin_pairs<64>" in loop
    assert not any(SERIALIZED in w for w in warns), warns
    ops = _ops(k)
    assert ops["LDL"] + ops["STL"] == 0 and ops["PRMT"] == 0  # P carried packed, no repacking
    off = bench("128x128", causal, **cfg(EARLY, extra)).get_kernel_source()
    assert "for (long long k = 1; k <" not in off


@needs_toolchain
def test_the_rotation_leaves_a_one_gemm_loop_alone():
    from test_general_gemm import gemm

    func = gemm(512, 512, 256)
    plain = tilecore.compile(func, target=HOPPER, pass_configs=GENERAL).get_kernel_source()
    rotated = tilecore.compile(func, target=HOPPER, pass_configs={**GENERAL, **D59["overlap"]}).get_kernel_source()
    assert plain == rotated


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_descriptors_inside_the_k_loop_are_the_first_steps_plus_a_constant(causal):
    """tilecore.cuda.descriptor_offsets: each wgmma descriptor of an unrolled k loop is the descriptor of the
    loop's first step advanced by the step's offset (a constant once unrolled): the uniform datapath computes one
    descriptor a gemm, not one an instruction. The same addresses: the swizzle's term of a whole-panel origin,
    ``(x * 128) % 8``, is 0, and the offset of step mk is its address minus the first's."""
    on = bench("128x128", causal, **cfg(EARLY, PP, D59["desc"]))
    off = bench("128x128", causal, **cfg(EARLY, PP, D59["overlap"]))
    src = on.get_kernel_source()
    assert src.count("tc_wg_desc_at(tc_wg_desc(") >= 6  # S's Q and K, P @ V's V: in the peel, loop and drain
    assert "tc_wg_desc_at" not in off.get_kernel_source()
    assert "(tc_floormod(((mk * 16) / 8), 8) * 8)" in src  # the swizzle term of step mk, the warp's term gone
    u_on = sum(v for op, v in _ops(on).items() if op.startswith("U"))
    u_off = sum(v for op, v in _ops(off).items() if op.startswith("U"))
    assert u_on < u_off - 40, (u_on, u_off)
    assert _ops(on)["LDL"] + _ops(on)["STL"] == 0


@needs_toolchain
@pytest.mark.parametrize("form", ["thread0", "pingpong"])
def test_the_causal_mask_after_the_first_gemm_leaves_the_unmasked_iterations_its_zeros(form):
    """tilecore.pipeline_mask_after_gemm: the split mask (``if k < E: S = 0 else S = select(mask, 0, -inf)``)
    becomes ``S = 0`` before S = Q K^T and ``if !(k < E): S = select(mask, S, -inf)`` after its wait: the
    unmasked iterations' zeros fold into the first HGMMA (no CS2R in that path through the loop), the masked
    ones select after it."""
    extra = PP if form == "pingpong" else {}
    on, warns = _compile_warnings(lambda: bench("128x128", True, **cfg(EARLY, extra, D59["mask"])))
    off = bench("128x128", True, **cfg(EARLY, extra, D59["overlap"]))
    loop = _rotated_loop(on.get_kernel_source())
    after = loop.index("} else {", loop.index("tc_wg_wait<1>();"))
    assert loop.index("tc_wg_wait<1>();") < loop.index("if ((k < tc_min(32, ") < after < loop.index("acc_s[0] = exp2f(")
    assert re.search(r"acc_s\[0\] = \(valid_1\w* \? acc_s\[0\] : \(-INFINITY\)\);", loop[after:])
    assert loop.count("if ((k < tc_min(32, ") == 1
    off_loop = _rotated_loop(off.get_kernel_source())
    assert off_loop.index("if ((k < tc_min(32, ") < off_loop.index("tc_wg_wait<1>();")  # before: the mask first

    def unmasked(k):
        ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        return min((c for _, c in sass_paths.paths(ins, sass_paths.main_loop(ins, 16))),
                   key=lambda c: sum(v for n, v in c.items() if n[0].isupper()))

    u_on, u_off = unmasked(on), unmasked(off)
    assert u_off["CS2R"] > 0 and u_on["CS2R"] == 0, (u_on["CS2R"], u_off["CS2R"])
    assert not any(SERIALIZED in w for w in warns), warns
    assert _ops(on)["LDL"] + _ops(on)["STL"] == 0
    # non-causal: no split mask, nothing to move
    assert bench("128x128", False, **cfg(EARLY, extra, D59["mask"])).get_kernel_source() == \
        bench("128x128", False, **cfg(EARLY, extra, D59["overlap"])).get_kernel_source()


@needs_toolchain
def test_stage_slots_and_parities_of_a_nonnegative_loop_index_are_masks_and_shifts():
    """tilecore.cuda.nonnegative_index_shifts: inside a loop whose start is a constant (0 or 1), ``k % 2`` and
    ``k / 2`` (a stage's slot and its barrier's parity) and ``(k - 1) % 2`` where k starts at 1 are a mask and a
    shift; a value not shown nonnegative keeps tc_floormod."""
    on = bench("128x128", False, **cfg(EARLY, PP, D59["all"]))
    off = bench("128x128", False, **cfg(EARLY, PP, D59["desc"]))
    loop_on, loop_off = _rotated_loop(on.get_kernel_source()), _rotated_loop(off.get_kernel_source())
    assert "tc_floormod(k, 2)" in loop_off and "tc_floormod(k, 2)" not in loop_on
    assert "(k & 1)" in loop_on and "(k >> 1)" in loop_on and "((k + (-1)) & 1)" in loop_on
    u_on = sum(v for op, v in _ops(on).items() if op.startswith("U"))
    u_off = sum(v for op, v in _ops(off).items() if op.startswith("U"))
    assert u_on < u_off
    assert _ops(on)["LDL"] + _ops(on)["STL"] == 0


@needs_toolchain
def test_descriptor_offsets_apply_to_a_general_path_gemm():
    from test_general_gemm import gemm

    func = gemm(512, 512, 256)
    k = tilecore.compile(func, target=HOPPER, pass_configs={**GENERAL, "tilecore.cuda.descriptor_offsets": True})
    assert "tc_wg_desc_at(tc_wg_desc(" in k.get_kernel_source()
    assert "tc_wg_desc_at" not in tilecore.compile(func, target=HOPPER, pass_configs=GENERAL).get_kernel_source()


#: other forms the defaults rotate (D59): (name, dim, bm, bn, dtype, kv_heads, stages)
D59_FORMS = [("bf16", 128, 128, 128, "bfloat16", None, 2), ("gqa", 128, 128, 128, "float16", 1, 2),
             ("d256", 256, 128, 64, "float16", None, 2), ("3stages", 128, 128, 128, "float16", None, 3)]


@needs_toolchain
@pytest.mark.parametrize("form", D59_FORMS, ids=[f[0] for f in D59_FORMS])
def test_the_defaults_rotate_other_forms_too(form):
    _, dim, bm, bn, dtype, kvh, stages = form
    func = flash_attention_forward(1000, dim, 3, bm, bn, dtype, True, batch=2, threads=256, kv_heads=kvh,
                                   num_stages=stages)
    k, warns = _compile_warnings(lambda: tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs=GENERAL))
    note = k.meta["attrs"]["pipelines"][0]
    assert "the last gemm one iteration late" in note and "ping-pong" in note, note
    assert _ops(k)["LDL"] + _ops(k)["STL"] == 0 and not any(SERIALIZED in w for w in warns), warns


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", D59_FORMS, ids=[f[0] for f in D59_FORMS])
def test_d59_default_forms_match_float64(form, causal):
    """The defaults (the rotated body on the producer warpgroup with ping-pong) on bfloat16, grouped-query heads,
    d256 at 128x64 and 3 stages, a ragged sequence, against float64."""
    import torch

    _, dim, bm, bn, dtype, kvh, stages = form
    seq, heads, batch = 1000, 3, 2
    func = flash_attention_forward(seq, dim, heads, bm, bn, dtype, causal, batch=batch, threads=256,
                                   kv_heads=kvh, num_stages=stages)
    kern = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs=GENERAL)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(17)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=tdt, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=tdt, generator=g) for _ in range(2))
    out = kern(q, k, v)
    torch.cuda.synchronize()
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (out.double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < (1.6e-2 if dtype == "bfloat16" else 2e-3), f"{form[0]} causal={causal}: max error {err}"


@hopper_gpu
def test_descriptor_offsets_give_a_gemm_the_same_bits():
    import torch
    from test_general_gemm import gemm

    M, N, K = 1000, 1800, 1000  # ragged: the bulk copies' zero fill
    g = torch.Generator(device="cuda").manual_seed(3)
    a = (torch.randn(M, K, device="cuda", generator=g) / 8).half()
    b = (torch.randn(K, N, device="cuda", generator=g) / 8).half()
    outs = []
    for extra in ({}, {"tilecore.cuda.descriptor_offsets": True}):
        k = tilecore.compile(gemm(M, N, K), target=HOPPER, pass_configs={**GENERAL, **extra})
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        k(a, b, c)
        torch.cuda.synchronize()
        outs.append(c)
    ref = a.double() @ b.double()
    assert float((outs[1].double() - ref).abs().max()) < 3e-2
    assert torch.equal(outs[0], outs[1])


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile,variant", [("128x128", "fence"), ("64x64", "fence"), ("128x128", "pp_fence"),
                                          ("128x128", "overlap"), ("128x128", "ws_overlap"),
                                          ("128x128", "pp_overlap"), ("128x128", "pp_desc"),
                                          ("128x128", "pp_all"), ("64x64", "desc"), ("64x64", "all"),
                                          ("128x128", "mask"), ("128x128", "pp_mask")])  # ping-pong: two consumer warpgroups
def test_d59_options_match_float64(tile, causal, variant):
    import torch

    seq, dim, heads, batch = 456, 128, 3, 2  # a ragged last block for both tiles
    name = variant.split("_")[-1]
    form = {"pp": PP, "ws": WS}.get(variant.split("_")[0], {}) if "_" in variant else {}
    configs = {**cfg(EARLY, form, D59[name])}
    kern = fa(seq, dim, heads, tile, causal, batch=batch, **configs)
    g = torch.Generator(device="cuda").manual_seed(13)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    out = kern(q, k, v)
    torch.cuda.synchronize()
    err = (out.double() - _reference(q, k, v, causal)).abs().max().item()
    assert err < 2e-3, f"{tile} causal={causal} {variant}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_d59_options_give_the_same_bits(causal):
    """Each D59 option orders or pins, it changes no arithmetic: the exact build's outputs bit for bit those of
    D55's options without it."""
    import torch

    seq, dim, heads, batch = 512, 128, 2, 2
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    base = fa(seq, dim, heads, "128x128", causal, batch=batch, **EARLY)(q, k, v)
    for name, opt in D59.items():
        moved = fa(seq, dim, heads, "128x128", causal, batch=batch, **cfg(EARLY, opt))(q, k, v)
        torch.cuda.synchronize()
        assert torch.equal(base, moved), name
    # with the producer warpgroup and ping-pong: the rotation against the same form without it
    pp = fa(seq, dim, heads, "128x128", causal, batch=batch, **cfg(EARLY, PP))(q, k, v)
    pp_rot = fa(seq, dim, heads, "128x128", causal, batch=batch, **cfg(EARLY, PP, D59["overlap"]))(q, k, v)
    pp_desc = fa(seq, dim, heads, "128x128", causal, batch=batch, **cfg(EARLY, PP, D59["desc"]))(q, k, v)
    pp_all = fa(seq, dim, heads, "128x128", causal, batch=batch, **cfg(EARLY, PP, D59["all"]))(q, k, v)
    pp_mask = fa(seq, dim, heads, "128x128", causal, batch=batch, **cfg(EARLY, PP, D59["mask"]))(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(pp, pp_rot) and torch.equal(base, pp) and torch.equal(pp, pp_desc) and torch.equal(pp, pp_all)
    assert torch.equal(pp, pp_mask)


# -- D61: the epilogue's O / l with div.rn's fast path, the reciprocal once a row ----------------------------

ROWDIV_OFF = {"tilecore.cuda.row_division": False}


def _division_side(k):
    """The SASS of the branch side that divides by the rows' reciprocals: straight-line code a conditional branch
    jumps to, with at least 3 FFMA for each of the thread's 64 divisions and no division's own check (FCHK), slow
    path (CALL) or reciprocal (MUFU.RCP); None where there is none."""
    ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
    pos = {a: n for n, (a, _) in enumerate(ins)}
    for _, t in ins:
        m = sass_paths._TARGET.search(t)
        if sass_paths.opcode(t) != "BRA" or not t.startswith("@") or not m:
            continue
        n = pos.get(int(m.group(1), 16))
        side = []
        while n is not None and n < len(ins) and (sass_paths.opcode(ins[n][1]) != "BRA" or ins[n][1].startswith("@")):
            side.append(ins[n][1])
            n += 1
        ops = [sass_paths.opcode(x) for x in side]
        if ops.count("FFMA") >= 3 * 64 and "FCHK" not in ops and "CALL" not in ops and not any("MUFU.RCP" in x
                                                                                                for x in side):
            return side
    return None


@needs_toolchain
@pytest.mark.parametrize("causal", [False, True])
def test_the_epilogue_divides_by_each_rows_reciprocal(causal):
    """D61: the general path's ``acc_o[i, j] = acc_o[i, j] / logsum[i]`` (the fragment lowering's 64 stores a
    thread) as tc_div_fast with the two rows' reciprocals where every operand is in range, the division as written
    otherwise; on by default (D60's option), off as asked, never under fast math."""
    src = fa(4096, 128, 32, "128x128", causal, batch=8).get_kernel_source()
    assert src.count("tc_div_rcp(logsum[") == 2 and src.count("tc_div_safe(acc_o[") == 64
    fast = re.findall(r"acc_o\[(\d+)\] = tc_div_fast\(acc_o\[(\d+)\], logsum\[(\d)\], tc_dr(\d)\);", src)
    assert len(fast) == 64 and all(a == b for a, b, _, _ in fast)
    # the row of register 4 j + 2 h + e is h (the accumulator's layout), the reciprocal that row's
    assert all(int(r) == (int(a) // 2) % 2 == int(d) for a, _, r, d in fast)
    slow = re.findall(r"acc_o\[(\d+)\] = \(acc_o\[\d+\] / logsum\[(\d)\]\);", src)
    assert sorted(slow) == sorted((a, r) for a, _, r, _ in fast)
    asked = fa(4096, 128, 32, "128x128", causal, batch=8, **{"tilecore.cuda.row_division": True})
    assert asked.get_kernel_source() == src
    off = fa(4096, 128, 32, "128x128", causal, batch=8, **ROWDIV_OFF).get_kernel_source()
    assert "tc_div_" not in off and off.count("/ logsum[") == 64
    fm = fa(4096, 128, 32, "128x128", causal, batch=8, **{"tilecore.fast_math": True}).get_kernel_source()
    assert "tc_div_" not in fm


@needs_toolchain
def test_the_division_side_has_no_division_calls():
    """The side taken when every operand is in range: 3 FFMA a division and the rows' Newton steps, no MUFU.RCP,
    FCHK or CALL (the other side keeps the 64 divisions' slow-path calls: as many as without the option); without
    the option no such side; no local memory."""
    k = fa(4096, 128, 32, "128x128", True, batch=8)
    side = _division_side(k)
    assert side is not None
    assert 3 * 64 <= collections.Counter(sass_paths.opcode(t) for t in side)["FFMA"] <= 3 * 64 + 4
    off = fa(4096, 128, 32, "128x128", True, batch=8, **ROWDIV_OFF)
    assert _division_side(off) is None
    assert _ops(k)["CALL"] == _ops(off)["CALL"] == 64 and _ops(k)["FCHK"] == _ops(off)["FCHK"] == 64
    assert _ops(k)["LDL"] + _ops(k)["STL"] == 0


@needs_toolchain
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the host emulator needs g++ (C++20)")
def test_the_division_gives_the_same_bits_on_the_host():
    """The catalog's 32x32 attention on sm_80's general path (the same lowering), run by the host emulator: bit for
    bit the option off, a head with zero outputs (the division as written there) included."""
    from cuda_host_emulator import run_on_host

    rng = np.random.default_rng(4)
    seq, dim = 192, 64
    q, kk, v = (rng.standard_normal((2, seq, dim)).astype(np.float16) for _ in range(3))
    v[1, :5] = 0
    outs = []
    for extra in ({}, ROWDIV_OFF):
        func = flash_attention_forward(seq, dim, 2, 32, 32, "float16", True, threads=128)
        k = tilecore.compile(func, target="cuda:sm_80", pass_configs={**GENERAL, **extra})
        assert ("tc_div_fast(" in k.get_kernel_source()) == (not extra)
        outs.append(run_on_host(k, [q, kk, v, np.full(q.shape, np.nan, np.float16)])[3])
    assert not np.isnan(outs[0]).any() and outs[0].tobytes() == outs[1].tobytes()


#: (name, seq, dim, bm, bn, threads, causal, kv_heads): the benchmark's tiles on the general path, ragged sequences
D61_DEVICE = [("128-causal", 1000, 128, 128, 128, 256, True, None), ("128", 1000, 128, 128, 128, 256, False, None),
              ("176-ragged", 1000, 128, 128, 176, 256, False, None), ("176-causal", 1000, 128, 128, 176, 256, True, None),
              ("d64-64x64", 1000, 64, 64, 64, 128, True, None), ("gqa", 1000, 128, 128, 128, 256, True, 1)]


@hopper_gpu
@pytest.mark.parametrize("case", D61_DEVICE, ids=[c[0] for c in D61_DEVICE])
def test_d61_row_division_gives_the_same_bits(case):
    """The division by the rows' reciprocals bit for bit the IEEE division (the option off), head 1's outputs
    scaled below 2^-40 in some rows (the division as written there), and against float64."""
    import torch

    _, seq, dim, bm, bn, threads, causal, kvh = case
    heads, batch = 3, 2
    g = torch.Generator(device="cuda").manual_seed(23)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
            for _ in range(2))
    v[0, 0] = 0  # a head of zero outputs (out of the fast side's range: the division as written)
    v[1, 0, :, :5] = 0  # five zero columns: in each warp threads on either side
    outs = []
    for extra in ({}, ROWDIV_OFF):
        func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=threads,
                                       kv_heads=kvh)
        kern = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **extra})
        assert ("tc_div_fast(" in kern.get_kernel_source()) == (not extra)
        outs.append(kern(q, k, v))
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs[0].double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 2e-3, f"{case[0]}: max error {err}"


# -- D61: the route, tilecore.cuda.register_programs = True / False / "auto" ---------------------------------

def _routed(func, route, **extra):
    return tilecore.compile(func, target=HOPPER, out_idx=[3],
                            pass_configs={**NOCACHE, "tilecore.cuda.register_programs": route, **extra})


@needs_toolchain
@pytest.mark.parametrize("form", [("d128", 128, 128, 128, None), ("gqa", 128, 128, 128, 8)], ids=lambda f: f[0])
def test_auto_routes_flash_attentions_two_warpgroup_form_to_the_general_path(form):
    """D86: "auto" (the default) compiles FlashAttention's form as False does (the general path), its note naming the
    retirement; True, which forced the WGMMA register program, is refused naming D86 and what runs instead."""
    _, dim, bm, bn, kvh = form
    func = flash_attention_forward(4096, dim, 32, bm, bn, "float16", True, batch=8, threads=256, kv_heads=kvh)
    auto, general = _routed(func, "auto"), _routed(func, False)
    assert auto.get_kernel_source() == general.get_kernel_source()
    assert any("general path" in n and "retired (D86)" in n for n in auto.meta["attrs"]["hopper_pipelines"])
    with pytest.raises(tilecore.errors.CompileError, match=r"register_programs=True: the WGMMA register program "
                                                           r"\(sm_90a\) is retired \(D86.*core's general path"):
        _routed(func, True)


@needs_toolchain
def test_every_form_of_the_retired_program_compiles_on_the_general_path():
    """D86: every FlashAttention form the WGMMA register program took, those D77-D83 routed and the ones it kept until
    D86 (d64 at 128x176 in both builds, d128 at 128x64 with two consumer warpgroups: TileLang's GQA backward example's
    forward block), compiles by default as register_programs=False (the general path, the same source), its note
    naming D86; on sm_80 True still forces the mma.sync register program. A GEMM compiles as before (True allowed:
    not the program's form once the Hopper GEMM pipeline took it)."""
    def fa(dim, bm, bn, threads, causal=True, kv=None):
        return flash_attention_forward(4096, dim, 32, bm, bn, "float16", causal, batch=8, threads=threads, kv_heads=kv)

    fast = {"tilecore.fast_math": True}
    forms = [(fa(256, 128, 64, 256), {}), (fa(128, 128, 176, 256), fast), (fa(128, 128, 176, 256), {}),
             (fa(128, 64, 64, 128), {}), (fa(64, 64, 64, 128, False), fast), (fa(64, 128, 128, 256, False), {}),
             (fa(64, 128, 176, 256), {}), (fa(64, 128, 176, 256, False), fast),
             (fa(128, 128, 64, 256), {}), (fa(128, 128, 64, 256, kv=8), fast)]
    for func, extra in forms:
        auto = _routed(func, "auto", **extra)
        assert auto.get_kernel_source() == _routed(func, False, **extra).get_kernel_source()
        assert any("retired (D86)" in n for n in auto.meta["attrs"]["hopper_pipelines"])
        assert tilecore_cuda.lowering_path(auto) == "generic"
    sm80 = tilecore.compile(fa(128, 128, 128, 256), target="cuda:sm_80", out_idx=[3],
                            pass_configs={**NOCACHE, "tilecore.cuda.register_programs": True})
    assert tilecore_cuda.lowering_path(sm80) == "register program (mma.sync)"
    from test_cuda_hopper import gemm

    g = gemm(1024, 1024, 1024)
    a = tilecore.compile(g, target=HOPPER, pass_configs={**NOCACHE, "tilecore.cuda.register_programs": "auto"})
    t = tilecore.compile(g, target=HOPPER, pass_configs={**NOCACHE, "tilecore.cuda.register_programs": True})
    assert a.get_kernel_source() == t.get_kernel_source()


@needs_toolchain
@pytest.mark.parametrize("option", ["tilecore.cuda.pingpong", "tilecore.cuda.attention_persistent",
                                    "tilecore.cuda.producer_registers"])
def test_the_retired_programs_options_are_refused(option):
    """D86: an option only the WGMMA register program read is refused naming it and D86, on any CUDA target."""
    func = flash_attention_forward(1024, 128, 2, 128, 128, "float16", True, threads=256)
    for target in (HOPPER, "cuda:sm_80"):
        with pytest.raises(tilecore.errors.CompileError, match=f"pass config {option}: .*retired in D86"):
            tilecore.compile(func, target=target, out_idx=[3], pass_configs={**NOCACHE, option: 40})


@needs_toolchain
def test_auto_sets_a_forms_own_defaults(monkeypatch):
    """D82: where AUTO_FORM_DEFAULTS names a form of AUTO_GENERAL, "auto" compiles it as the general path with those
    options (tilecore.warp_specialize=True: a producer warpgroup at one consumer warpgroup), its note names them; a
    value the compile's config gives wins; other forms are as before (AUTO_FORM_DEFAULTS is data)."""
    from tilecore_cuda import regprog

    form = (128, None, 1, 64)
    monkeypatch.setattr(regprog, "AUTO_FORM_DEFAULTS", {form: {"tilecore.warp_specialize": True}})
    monkeypatch.setattr(regprog, "AUTO_FORM_WHY", {form: "a test"})
    one = flash_attention_forward(1024, 128, 2, 64, 64, "float16", False, threads=128)
    auto = _routed(one, "auto")
    ws = _routed(one, False, **{"tilecore.warp_specialize": True})
    assert auto.get_kernel_source() == ws.get_kernel_source() != _routed(one, False).get_kernel_source()
    assert auto.meta["attrs"]["simt_threads"] == 256  # the producer warpgroup beside the one consumer
    assert any("tilecore.warp_specialize=True (a test)" in n for n in auto.meta["attrs"]["hopper_pipelines"])
    off = _routed(one, "auto", **{"tilecore.warp_specialize": False})
    assert off.get_kernel_source() == _routed(one, False).get_kernel_source()
    two = flash_attention_forward(1024, 128, 2, 128, 128, "float16", False, threads=256)
    assert _routed(two, "auto").get_kernel_source() == _routed(two, False).get_kernel_source()


#: D82: the options "auto" gives d256 at 64x64 on the general path (AUTO_FORM_DEFAULTS)
D82 = {"tilecore.warp_specialize": True, "tilecore.bulk_store": True}


@needs_toolchain
@pytest.mark.parametrize("fast", [False, True])
def test_auto_routes_d256_64x64_with_a_producer_warpgroup(fast):
    """D82: "auto" (the default) gives d256 at 64x64 (one consumer warpgroup) to the general path with a producer
    warpgroup and O by bulk stores (fa_route.py's wsb row), causal and not; the note names the form's defaults; each
    option the config gives False wins; True is refused (D86: the register program is retired; the defaults kept)."""
    from tilecore_cuda import regprog

    assert regprog.AUTO_FORM_DEFAULTS[(256, None, 1, 64)] == D82
    for causal in (False, True):
        func = flash_attention_forward(4096, 256, 32, 64, 64, "float16", causal, batch=8, threads=128)
        extra = {"tilecore.fast_math": fast}
        default = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**NOCACHE, **extra})
        assert default.get_kernel_source() == _routed(func, False, **extra, **D82).get_kernel_source()
        assert tilecore_cuda.lowering_path(default) == "generic"
        attrs = default.meta["attrs"]
        assert attrs["simt_threads"] == 256 and "acc_o_st" in default.get_kernel_source()  # producer; staging tile
        assert any("tilecore.warp_specialize=True, tilecore.bulk_store=True (D82)" in n
                   for n in attrs["hopper_pipelines"]), attrs["hopper_pipelines"]
        no_ws = _routed(func, "auto", **extra, **{"tilecore.warp_specialize": False})
        assert no_ws.get_kernel_source() == _routed(func, False, **extra, **{"tilecore.bulk_store": True}).get_kernel_source()
        with pytest.raises(tilecore.errors.CompileError, match="retired"):  # D86: no register program to force
            _routed(func, True, **extra)
    sass = tilecore_cuda.CUDABackend().disassemble(default.binary, default.target)
    assert "LDL" not in sass and "STL" not in sass  # no spills (238 registers exact, 204 fast: NVRTC 13.0)


@hopper_gpu
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_d82_d256_64x64_route_matches_float64_and_the_bits(causal, fast):
    """D82's route for d256 at 64x64 (a producer warpgroup, O by bulk stores) on the device, ragged sequences: against
    float64; in the exact build bit for bit the general path's thread-0 form with direct stores (the options move
    work, not arithmetic; under fast math the two kernels' contractions may differ: D82 round 2 saw the non-causal
    fast row differ, within fast math's bound); the exit waiting only for the stores' reads bit for bit the route's."""
    import torch

    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(41)
    q, k, v = (torch.randn(batch, heads, seq, 256, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    outs = []
    for route, extra in (("auto", {}), (False, {}), ("auto", EXIT_READ)):
        func = flash_attention_forward(seq, 256, heads, 64, 64, "float16", causal, batch=batch, threads=128)
        kern = _routed(func, route, **{"tilecore.fast_math": fast, **extra})
        assert tilecore_cuda.lowering_path(kern) == "generic"
        outs.append(kern(q, k, v))
    torch.cuda.synchronize()
    ref = _reference(q, k, v, causal)
    for name, o in zip(("auto", "thread-0 form", "exit read"), outs):
        err = (o.double() - ref).abs().max().item()
        assert err < (4e-3 if fast else 2e-3), f"{name} causal={causal} fast={fast}: max error {err}"
    assert torch.equal(outs[0], outs[2]), "the exit's wait changed the output"
    if not fast:
        assert torch.equal(outs[0], outs[1]), "the route's options changed the exact build's output"


#: D82: the kernel's last wait for its bulk stores only for their reads of block memory
EXIT_READ = {"tilecore.bulk_store_exit_wait": "read"}


@needs_toolchain
def test_bulk_store_exit_wait():
    """tilecore.bulk_store_exit_wait: "done" (the default) ends the kernel waiting for the bulk stores' writes
    (tc_bulk_wait), "read" for their reads of block memory only (tc_bulk_wait_read), the rest the same; a bad value
    is refused naming the option and its values."""
    func = flash_attention_forward(1024, 256, 2, 64, 64, "float16", True, threads=128)
    done, read = (_routed(func, "auto", **extra).get_kernel_source() for extra in ({}, EXIT_READ))
    tail = lambda src: src[src.rindex("tc_bulk_commit();"):]  # noqa: E731
    assert "tc_bulk_wait<0>();" in tail(done) and "tc_bulk_wait_read" not in tail(done)
    assert "tc_bulk_wait_read<0>();" in tail(read) and "tc_bulk_wait<0>" not in tail(read)
    i = done.rindex("tc_bulk_wait<0>();")
    assert read == done[:i] + "tc_bulk_wait_read<0>();" + done[i + len("tc_bulk_wait<0>();"):]
    with pytest.raises(tilecore.errors.CompileError, match="bulk_store_exit_wait='soon': expected one of 'done', 'read'"):
        _routed(func, "auto", **{"tilecore.bulk_store_exit_wait": "soon"})


@needs_toolchain
def test_a_route_other_than_true_false_or_auto_is_refused():
    func = flash_attention_forward(1024, 128, 2, 128, 128, "float16", True, threads=256)
    with pytest.raises(tilecore.errors.CompileError, match='register_programs must be True, False or "auto"'):
        _routed(func, "yes")


# -- D61: V staged regardless of the occupancy rule (tilecore.pipeline_stage_late) ----------------------------

STAGE = {"tilecore.pipeline_stage_late": True}
#: (name, dim, bm, bn, threads): the forms the occupancy rule leaves unrotated (V not staged)
UNSTAGED = [("d64-128x128", 64, 128, 128, 256), ("d128-64x64", 128, 64, 64, 128)]


@needs_toolchain
@pytest.mark.parametrize("form", UNSTAGED, ids=[f[0] for f in UNSTAGED])
def test_staging_v_regardless_of_occupancy_rotates_the_loop(form):
    _, dim, bm, bn, threads = form
    func = flash_attention_forward(4096, dim, 32, bm, bn, "float16", True, batch=8, threads=threads)
    # (with D61's default bulk store of O the d64 128x128 kernel's shared memory already leaves it 2 blocks: V staged)
    # (D66: "auto" stages V regardless in the two-consumer form; "occupancy" is D61's rule for every loop)
    plain = tilecore.compile(func, target=HOPPER, out_idx=[3],
                             pass_configs={**GENERAL, **DIRECT, "tilecore.pipeline_stage_late": "occupancy"})
    note = plain.meta["attrs"]["pipelines"][0]
    assert "staging V_s would leave" in note and "one iteration late" not in note
    k, warns = _compile_warnings(lambda: tilecore.compile(func, target=HOPPER, out_idx=[3],
                                                          pass_configs={**GENERAL, **STAGE, **DIRECT}))
    note = k.meta["attrs"]["pipelines"][0]
    assert "V_s bulk tile copies" in note and "the last gemm one iteration late" in note, note
    assert ("ping-pong" in note) == (threads == 256)
    assert _ops(k)["LDL"] + _ops(k)["STL"] == 0 and not any(SERIALIZED in w for w in warns), warns


#: the one-consumer forms with the producer warpgroup asked for (benchmarks/cuda_attention.py's stage_ws / ws1)
WS1 = {"tilecore.warp_specialize": True}
D61_STAGED = [(UNSTAGED[0], STAGE), (UNSTAGED[1], STAGE), (UNSTAGED[1], {**STAGE, **WS1}),
              (("d256-64x64", 256, 64, 64, 128), WS1)]


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form,option", D61_STAGED, ids=["d64-stage", "64x64-stage", "64x64-stage-ws", "d256-ws1"])
def test_d61_staged_forms_match_float64_and_the_bits(form, option, causal):
    import torch

    _, dim, bm, bn, threads = form
    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(29)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    outs = []
    for extra in (option, {}):
        func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=threads)
        outs.append(tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **extra})(q, k, v))
    torch.cuda.synchronize()
    err = (outs[0].double() - _reference(q, k, v, causal)).abs().max().item()
    assert err < 2e-3, f"{form[0]} causal={causal}: max error {err}"
    assert torch.equal(outs[0], outs[1])  # staging, rotating and specializing move work, no arithmetic (D59)


# -- D61: fast math's float max / min as fmaxf / fminf (tilecore.cuda.fast_minmax) ----------------------------

@needs_toolchain
def test_fast_math_row_maximum_is_one_fmnmx_an_element():
    """Under fast math the general path's row maximum takes FMNMX (fmaxf), the register program's instruction: as
    many in the main loop as the register program's, no FSEL; with the option off the compare and select."""
    def loop(**extra):
        k = fa(4096, 128, 32, "128x128", False, batch=8, **{"tilecore.fast_math": True, **extra})
        ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
        return min((c for _, c in sass_paths.paths(ins, sass_paths.main_loop(ins, 16))),
                   key=lambda c: sum(c.values())), k.get_kernel_source()

    (on, src), (off, src_off) = loop(), loop(**{"tilecore.cuda.fast_minmax": False})
    func = flash_attention_forward(4096, 128, 32, 128, 128, "float16", False, batch=8, threads=256)
    rp = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**NOCACHE, "tilecore.fast_math": True})
    ins = sass_paths.parse(tilecore_cuda.CUDABackend().disassemble(rp.binary, rp.target))
    ref = min((c for _, c in sass_paths.paths(ins, sass_paths.main_loop(ins, 16))), key=lambda c: sum(c.values()))
    assert 64 <= on["FMNMX"] <= ref["FMNMX"] and on["FSEL"] == 0  # (D70's four chains: 68 against 70)
    assert off["FMNMX"] < 8 and off["FSEL"] >= 64
    assert "fmaxf(" in src and "fmaxf(" not in src_off
    exact = fa(4096, 128, 32, "128x128", False, batch=8).get_kernel_source()
    assert "fmaxf(" not in exact  # the exact build keeps NaN-propagating max (tc_nanmax)


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_d61_fast_math_on_the_general_path_matches_float64(causal):
    """Fast math on the general path (fmaxf's row maximum, D61) against float64 and within fast math's error of
    the option off (the compare and select)."""
    import torch

    seq, dim, heads, batch = 1000, 128, 3, 2
    g = torch.Generator(device="cuda").manual_seed(31)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    outs = [fa(seq, dim, heads, "128x128", causal, batch=batch, **{"tilecore.fast_math": True, **extra})(q, k, v)
            for extra in ({}, {"tilecore.cuda.fast_minmax": False})]
    torch.cuda.synchronize()
    ref = _reference(q, k, v, causal)
    for o in outs:
        err = (o.double() - ref).abs().max().item()
        assert err < 4e-3, f"causal={causal}: max error {err}"


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", [("d128", 128, 128, 128, None), ("d256", 256, 128, 64, None),
                                  ("gqa", 128, 128, 128, 1)], ids=lambda f: f[0])
def test_d61_descriptor_offsets_on_the_defaults_give_the_same_bits(form, causal):
    """D59's descriptor offsets (measured again in D61's rows gdesc) on today's defaults: bit for bit without them."""
    import torch

    _, dim, bm, bn, kvh = form
    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(37)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    outs = []
    for extra in ({"tilecore.cuda.descriptor_offsets": True}, {}):
        func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=256,
                                       kv_heads=kvh)
        outs.append(tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **extra})(q, k, v))
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs[0].double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 2e-3, f"{form[0]} causal={causal}: max error {err}"


# -- D61: O through a shared tile and bulk tile stores (tilecore.bulk_store on O[b, h, rows, :]) --------------

BULK = {"tilecore.bulk_store": True}
#: FlashAttention's form without the default's bulk store (D61): the direct stores, before
DIRECT = {"tilecore.bulk_store_attention": False}
#: (name, dim, bm, bn, kv_heads, parts of O's columns): whole tile, and in parts where it does not fit beside the stages
BULK_FORMS = [("d128", 128, 128, 128, None, 1), ("176", 128, 128, 176, None, 2), ("d256", 256, 128, 64, None, 2),
              ("gqa", 128, 128, 128, 1, 1)]


@needs_toolchain
@pytest.mark.parametrize("form", BULK_FORMS, ids=[f[0] for f in BULK_FORMS])
def test_o_of_a_four_dimensional_tensor_is_a_bulk_store(form):
    """The copy of acc_o into O[b, h, bx * bm, 0] (a tile of a 4-D tensor's last two dimensions) is a bulk store when
    asked and by default (D61: FlashAttention's two-consumer form): stmatrix into the staging tile, one TMA store per
    panel and part, no global store; its tensor map has O's rank (box 1 in b and h); with
    tilecore.bulk_store_attention=False the direct stores and a note-free kernel."""
    _, dim, bm, bn, kvh, parts = form
    func = flash_attention_forward(4096, dim, 32, bm, bn, "float16", True, batch=8, threads=256, kv_heads=kvh)
    k = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **BULK})
    note = k.meta["attrs"]["bulk_store"][0]
    assert note.startswith("bulk store: acc_o -> O") and (f"in {parts} parts" in note) == (parts > 1), note
    ops = _ops(k)
    panels = dim * 2 // 128
    assert ops["UTMASTG"] == panels and ops["STSM"] == bm * dim // (256 * 8) and ops["STG"] == 0  # x4 a thread
    assert ops["LDL"] + ops["STL"] == 0
    plain = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs={**GENERAL, **DIRECT})
    assert "bulk_store" not in plain.meta["attrs"] and _ops(plain)["UTMASTG"] == 0
    default = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs=GENERAL)
    assert default.get_kernel_source() == k.get_kernel_source()  # the default since D61's round 2
    maps, loads = k.source.meta["tensor_maps"], plain.source.meta["tensor_maps"]
    assert len(maps) == len(loads) + 1 and all(len(m["box"]) == 4 for m in maps)  # Q, K, V and O's: O's rank


@hopper_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("form", BULK_FORMS, ids=[f[0] for f in BULK_FORMS])
def test_d61_bulk_store_of_o_gives_the_same_bits(form, causal):
    """O by bulk tile stores bit for bit the direct stores, a ragged sequence (the last block's rows past it clipped
    by the tensor map, not written into the next head), NaN-filled O checked everywhere; against float64."""
    import torch

    _, dim, bm, bn, kvh, _ = form
    seq, heads, batch = 1000, 3, 2
    g = torch.Generator(device="cuda").manual_seed(41)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(batch, kvh or heads, seq, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    outs = []
    for extra in (BULK, DIRECT):
        func = flash_attention_forward(seq, dim, heads, bm, bn, "float16", causal, batch=batch, threads=256,
                                       kv_heads=kvh)
        kern = tilecore.compile(func, target=HOPPER, pass_configs={**GENERAL, **extra})
        o = torch.full_like(q, float("nan"))
        kern(q, k, v, o)
        outs.append(o)
    torch.cuda.synchronize()
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])
    kr, vr = (x.repeat_interleave(heads // (kvh or heads), dim=1) for x in (k, v))
    err = (outs[0].double() - _reference(q, kr, vr, causal)).abs().max().item()
    assert err < 2e-3, f"{form[0]} causal={causal}: max error {err}"


@needs_toolchain
def test_the_bulk_store_default_takes_only_flash_attentions_two_consumer_form():
    """One consumer warpgroup (64x64, 128 threads) and the catalog's 32x32 kernel keep their direct stores."""
    for bm, bn, threads in ((64, 64, 128), (32, 32, 128)):
        func = flash_attention_forward(1024, 128, 2, bm, bn, "float16", True, threads=threads)
        k = tilecore.compile(func, target=HOPPER, out_idx=[3], pass_configs=GENERAL)
        assert "bulk_store" not in k.meta["attrs"] and _ops(k)["UTMASTG"] == 0


@needs_toolchain
def test_auto_changes_only_the_catalogs_warpgroup_attention():
    """register_programs="auto" (the default) against False on every conformance catalog kernel of cuda:sm_90a: the
    same source everywhere (D86: no kernel goes to the WGMMA register program); True is refused exactly where the
    retired program took the kernel: the two FlashAttention cases of the warpgroup tile."""
    from tilecore.compiler import lower
    from tilecore.errors import TilecoreError
    from tilecore_conformance.catalog import catalog

    def text(case, route):
        try:
            src = lower(case.build(**case.params), HOPPER,
                        {**case.pass_configs, "tilecore.cuda.register_programs": route})[3]
            return src.code
        except TilecoreError as e:
            return f"{type(e).__name__}: {e}"

    cases = catalog()
    assert len(cases) > 300
    assert [c.id for c in cases if text(c, "auto") != text(c, False)] == []
    refused = [c for c in cases if "retired (D86" in text(c, True)]
    assert sorted(c.id for c in refused) == ["attention/causal/float16/warpgroup_tile",
                                             "attention/full/float16/warpgroup_tile"]
