"""A persistent grid for the register programs (docs/decisions.md D45, ``tilecore.cuda.attention_persistent``, off
until the H100 measures it), through the public API: at most one block per SM (the profile's ``sm_count``, capped
at launch by the device's), each looping over the grid's tiles from ``blockIdx.x`` by ``gridDim.x``, where every
tile runs the same number of iterations (causal tiles of 1..32 iterations dealt round robin would leave SMs idle:
the hardware's block scheduler keeps them). The producer
runs on into the next tile: its K / V stages load under this tile's last iterations and epilogue (the stage ring's
count runs on over the block's tiles), and the tile loaded once (Q) has two buffers where they fit in shared memory
(128 x 128 at d128), else one that the producer reloads after the next tile's first stages once the consumers have
freed it (an ``qempty`` mbarrier, after the epilogue, which may store through it). The last consumer's last turn of a
tile hands consumer 0 the next tile's first turn (where the block has one), before its epilogue. The first gemm's zero fill becomes
a WGMMA that starts from zero (ptxas folds the fill itself in a single loop, not in a loop nested in the tile loop).

Without a GPU (CI): the notes, the launch (grid, the runtime's cap), no local memory, the main loop's SASS (the
WGMMA from zero, the count within 16 instructions of the one-tile kernel), the default unchanged; and the
protocol of whole blocks on the host (tests/regprog_persistent_sim.py: the producer and each consumer as actors
on the generated code's mbarriers, named barriers and TMA copies, random interleavings; no deadlock, every WGMMA
reads its own tile's data, nothing overwritten while held or read, the epilogue's store waited for before Q is
freed, every WGMMA inside its consumer's turn, every named barrier balanced at the block's end), with eight
mutations caught. On an sm_90 GPU: bit for bit against the one-tile kernel, with and without
the TMA-store epilogue and O's rescale under the next S, causal and ragged, against float64.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

import tilecore

tilecore_cuda = pytest.importorskip("tilecore_cuda")

sys.path.insert(0, str(Path(__file__).parent))
import regprog_persistent_sim as psim  # noqa: E402
import sass_paths  # noqa: E402
from test_cuda_backend import NOCACHE, needs_toolchain  # noqa: E402
from test_cuda_hopper import HOPPER, _attention, _notes, hopper_gpu, torch_cuda  # noqa: E402,F401

PERSIST = {"tilecore.cuda.attention_persistent": True}
TMA = {"tilecore.cuda.attention_tma_store": True}


@functools.lru_cache(maxsize=None)
def _k(shape, extra=()):
    return tilecore.compile(_attention(*shape), target=HOPPER, pass_configs={**NOCACHE, **dict(extra)})


#: (seq, dim, bm, bn, threads, causal); 384 / 128: three iterations a tile (an odd count, so a stage ring that
#: restarts at each tile would read the wrong stages)
SIM = {"d128": (384, 128, 128, 128, 256, False), "d128-ragged": (600, 128, 128, 128, 256, False),
       "176-ragged-tma": (640, 128, 128, 176, 256, False), "d64-3wg-ragged": (640, 64, 192, 64, 384, False)}


@needs_toolchain
def test_notes_launch_and_default():
    from tilecore_cuda import regprog

    assert regprog.ATTENTION_PERSISTENT_DEFAULT is False
    shape = (4096, 128, 128, 128, 256, False)
    base = tilecore.compile(_attention(*shape, heads=32, batch=8), target=HOPPER, pass_configs=NOCACHE)
    off = tilecore.compile(_attention(*shape, heads=32, batch=8), target=HOPPER,
                           pass_configs={**NOCACHE, "tilecore.cuda.attention_persistent": False})
    assert base.get_kernel_source() == off.get_kernel_source() and "persistent" not in _notes(base)
    k = tilecore.compile(_attention(*shape, heads=32, batch=8), target=HOPPER, pass_configs={**NOCACHE, **PERSIST})
    assert "persistent: at most 132 blocks loop over the tiles" in _notes(k) and "two buffers" in _notes(k)
    assert k.source.meta["grid"] == ["132", "1", "1"]
    assert k.source.meta["hopper_persistent"] == {"tiles": "8192", "blocks_per_sm": 1}
    k176 = tilecore.compile(_attention(4096, 128, 128, 176, 256, False, heads=32, batch=8), target=HOPPER,
                            pass_configs={**NOCACHE, **PERSIST})
    assert "one buffer for the tiles loaded once" in _notes(k176)
    # the mma.sync path and a kernel without the overlap say why not
    k80 = tilecore.compile(_attention(256, 64, 64, 64, 128, False), target="cuda:sm_80",
                           pass_configs={**NOCACHE, **PERSIST})
    assert "not persistent (the mma.sync path)" in _notes(k80)
    kno = _k(SIM["d128"], tuple({**PERSIST, "tilecore.cuda.intra_wg_overlap": False}.items()))
    assert "not persistent (needs the intra-warpgroup overlap)" in _notes(kno)
    # causal: tiles of 1..32 iterations; a static order would leave SMs idle
    kc = tilecore.compile(_attention(4096, 128, 128, 128, 256, True, heads=32, batch=8), target=HOPPER,
                          pass_configs={**NOCACHE, **PERSIST})
    assert "not persistent (the loop's trip count varies with the block" in _notes(kc)


@needs_toolchain
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "exact"])
def test_sass_main_loop(fast):
    shape = (4096, 128, 128, 128, 256, False)
    dis = tilecore_cuda.CUDABackend().disassemble
    pc = {**NOCACHE, "tilecore.fast_math": fast}
    on = tilecore.compile(_attention(*shape, heads=32, batch=8), target=HOPPER, pass_configs={**pc, **PERSIST})
    off = tilecore.compile(_attention(*shape, heads=32, batch=8), target=HOPPER, pass_configs=pc)
    son, soff = dis(on.binary, HOPPER), dis(off.binary, HOPPER)
    assert "STL" not in son and "LDL" not in son
    ins = sass_paths.parse(son)
    loop = [ins[k][1] for k in sass_paths.main_loop(ins)]
    assert sum("HGMMA" in t for t in loop) == 16
    assert sum("HGMMA" in t and "RZ, !UPT" in t for t in loop) == 1  # S = Q K^T starts from zero
    assert sum(t.startswith("IMAD.MOV.U32") for t in loop) < 8  # no 64 copies of a zero
    a, b = sass_paths.loop_counts(son)[0]["total"], sass_paths.loop_counts(soff)[0]["total"]
    assert 0 <= a - b <= 16, (a, b)  # ptxas 13.0: 473 / 459 fast, 739 / 725 exact (the stage count across tiles)


@needs_toolchain
@pytest.mark.parametrize("shape", list(SIM))
def test_protocol_on_the_host(shape):
    extra = {**PERSIST, **(TMA if "tma" in shape else {})}
    k = _k(SIM[shape], tuple(extra.items()))
    assert "persistent:" in _notes(k)
    assert psim.simulate(k, blocks=3, seeds=2) == []


class _Mutant:
    """``kernel`` with its generated source edited (in the producer's or the consumers' branch, or anywhere)."""

    def __init__(self, kernel, old: str, new: str, where: str = "all"):
        src = kernel.get_kernel_source()
        i = src.index("const int tc_c = ", src.rindex("__global__"))  # the consumers' branch
        if where == "consumers":
            out = src[:i] + src[i:].replace(old, new)
        elif where == "producer":
            out = src[:i].replace(old, new) + src[i:]
        else:
            out = src.replace(old, new)
        assert out != src, f"the mutation {old!r} changed nothing"
        self._src, self.source = out, kernel.source

    def get_kernel_source(self):
        return self._src


@needs_toolchain
@pytest.mark.parametrize("shape,old,new,where,what", [
    ("d128", "tc_qu & 1);", "0);", "consumers", ("deadlock", "reads (")),  # Q's phase not followed
    ("d128", "(tc_gb + tc_it)", "(tc_it)", "consumers", "deadlock"),  # the stage ring restarted at each tile
    ("d128", "tc_gb += ", "tc_gb -= 0 * ", "producer", "deadlock"),  # the producer's ring restarted
    ("176-ragged-tma", "if (tc_tn >= ", "if (tc_tn >= 99 + ", "producer", "still hold"),  # Q reloaded while in use
    ("176-ragged-tma", "tc_bulk_wait_read<0>();", ";", "all", "before its TMA store read it"),
    ("d128", "else if (tc_tile", "else if (0 && tc_tile", "consumers", "deadlock"),  # next tile's first turn kept
    ("d64-3wg-ragged", "tc_c == 2 && tc_tn == 0", "tc_c == 2", "consumers", ("deadlock", "twice", "nobody")),
    ("d128", "tc_named_sync(2 + tc_c, 256);  /* this consumer's turn on the tensor cores */", "/* no turn */",
     "consumers", ("outside its turn", "deadlock", "nobody")),  # WGMMA without their turns
], ids=["q-parity", "consumer-ring", "producer-ring", "q-reloaded-early", "store-not-waited", "next-turn-kept",
        "first-turn-every-tile", "gemm-outside-turn"])
def test_protocol_mutations_caught(shape, old, new, where, what):
    extra = {**PERSIST, **(TMA if "tma" in shape else {})}
    k = _k(SIM[shape], tuple(extra.items()))
    problems = psim.simulate(_Mutant(k, old, new, where), blocks=2, seeds=3)
    what = (what,) if isinstance(what, str) else what
    assert any(w in p for p in problems for w in what), problems[:3]


# -- on an sm_90 GPU ----------------------------------------------------------------------------------------------

#: (seq, dim, bm, bn, threads, causal, heads): more tiles than SMs where it matters (s4096 x 40 heads: 1280 tiles)
DEVICE = {"128": (4096, 128, 128, 128, 256, False, 40), "128-ragged": (1000, 128, 128, 128, 256, False, 160),
          "176-ragged": (1000, 128, 128, 176, 256, False, 160), "176": (4096, 128, 128, 176, 256, False, 40),
          "d64-3": (1000, 64, 192, 64, 384, False, 160)}


def _device_run(torch, shape, configs, fast=False):
    seq, dim, bm, bn, threads, causal, heads = DEVICE[shape]
    rng = np.random.default_rng(23)
    q, kk, v = (rng.standard_normal((heads, seq, dim)).astype(np.float16) for _ in range(3))
    qt, kt, vt = (torch.from_numpy(x).cuda() for x in (q, kk, v))
    k = tilecore.compile(_attention(seq, dim, bm, bn, threads, causal, heads=heads), target="cuda",
                         pass_configs={**configs, "tilecore.fast_math": fast})
    o = torch.full_like(qt, 7.0)
    k(qt, kt, vt, o)
    torch.cuda.synchronize()
    return (q, kk, v), o.double().cpu().numpy(), k


@hopper_gpu
@pytest.mark.parametrize("extra", [{}, {**TMA, "tilecore.cuda.rescale_under_qk": True}], ids=["direct", "tma-late"])
@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
@pytest.mark.parametrize("shape", list(DEVICE))
def test_device_persistent_bit_identical_and_float64(torch_cuda, shape, fast, extra):
    from tilecore_conformance.composite import attention_ref

    inputs, got, k = _device_run(torch_cuda, shape, {**PERSIST, **extra}, fast)
    assert "persistent:" in _notes(k)
    _, base, _ = _device_run(torch_cuda, shape, {}, fast)
    assert got.tobytes() == base.tobytes()
    seq, dim, *_, causal, heads = DEVICE[shape]
    sel = slice(0, 4)  # four heads against float64 (the rest bit for bit above)
    ref = attention_ref([x[sel] for x in inputs], "float16", causal, seq=seq, dim=dim)[0]
    np.testing.assert_allclose(got[sel], ref, atol=2e-2, rtol=2e-2)
