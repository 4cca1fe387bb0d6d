"""The CUDA matrix units as data (:class:`tilecore.layout.MatrixUnit`): which lane and register hold each
operand and accumulator element, written from the PTX ISA's fragment figures.

``mma.sync.aligned.m16n8k16`` (16-bit A and B, float32 accumulators; "Matrix Fragments for mma.m16n8k16
with floating point type"), with ``group = lane / 4`` and ``t = lane % 4``:

- A (16x16, 8 16-bit elements per lane, packed in pairs into 4 32-bit registers): element ``i`` is row
  ``group + 8 (i / 2 % 2)``, column ``2 t + i % 2 + 8 (i / 4)``;
- B (16x8, 4 elements): element ``i`` is row (k) ``2 t + i % 2 + 8 (i / 2)``, column ``group``;
- C (16x8, 4 float32): element ``i`` is row ``group + 8 (i / 2)``, column ``2 t + i % 2``.

The register programs (regprog.py) write the same C placement into their text: register ``4 j + 2 h + e``
of lane ``lane`` is column ``8 j + 2 (lane % 4) + e`` of row ``lane / 4 + 8 h``.

``wgmma.mma_async.m64nNk16`` (N = 8 .. 256 in steps of 8) over a warpgroup of 128 threads: the
accumulator of warp ``w`` is the mma.sync one for rows ``16 w ..``, repeated over ``N / 8`` column blocks
(register ``4 j + 2 h + e`` is column ``8 j + 2 (lane % 4) + e`` of row ``16 w + lane / 4 + 8 h``); A in
registers is the mma.sync A layout per warp; B (and A, where it is in shared memory) is read from shared
memory by the instruction through a matrix descriptor (an opaque layout): the core's matrix-unit GEMM
(tilecore.passes.matrix) gives those tiles the paneled, swizzled layout the descriptor describes. Kernels the
Hopper register programs take (regprog.py, hopper.py) keep their own wgmma code.
"""
from __future__ import annotations

from tilecore.layout import FragmentLayout, MatrixUnit

#: the key the CUDA emitter spells (codegen.CUDAEmitter.matrix_ops)
MMA_16816 = "mma_sync_m16n8k16"


def _mma_a(warps: int = 1) -> FragmentLayout:
    rows = [("thread", 8, 4), ("reg", 2, 2)] + ([("thread", warps, 32)] if warps > 1 else [])
    return FragmentLayout((16 * warps, 16), [rows, [("reg", 2, 1), ("thread", 4, 1), ("reg", 2, 4)]],
                          name="mma_m16n8k16.A" if warps == 1 else "wgmma.A")


def mma_16816_units() -> list:
    a = _mma_a()
    b = FragmentLayout((16, 8), [[("reg", 2, 1), ("thread", 4, 1), ("reg", 2, 2)], [("thread", 8, 4)]],
                       name="mma_m16n8k16.B")
    c = FragmentLayout((16, 8), [[("thread", 8, 4), ("reg", 2, 2)], [("reg", 2, 1), ("thread", 4, 1)]],
                       name="mma_m16n8k16.C")
    return [MatrixUnit("mma_sync", 16, 8, 16, ("float16", "bfloat16"), "float32", 32, a, b, c, MMA_16816)]


def wgmma_accumulator(n: int) -> FragmentLayout:
    """The m64nNk16 accumulator over a warpgroup (128 threads, ``n / 2`` registers per thread)."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma has N from 8 to 256 in steps of 8, not {n}")
    return FragmentLayout((64, n), [[("thread", 8, 4), ("reg", 2, 2), ("thread", 4, 32)],
                                    [("reg", 2, 1), ("thread", 4, 1), ("reg", n // 8, 4)]], name=f"wgmma_m64n{n}k16.C")


#: how the core lowers a gemm onto wgmma (tilecore.passes.matrix): A from registers or from its shared tile,
#: B from its shared tile, both read by descriptor in 128/64/32-byte swizzled panels; the instruction runs
#: behind the threads (a MatrixSync around each gemm: codegen.CUDAEmitter.stmt_MatrixSync)
WGMMA_ATTRS = {"operand_sources": {"a": ("register", "shared"), "b": ("shared",)},
               "shared_swizzles": (128, 64, 32), "async": True}


#: the 8-bit wgmma (m64nNk32, e4m3 / e5m2; D67): both operands read K-major from their shared tiles (the
#: instruction has no transpose for 8-bit types: B given as (N, K), ``transpose_B``), A only from its tile here
#: (its register form packs four 8-bit values a register, which the emitter does not spell)
WGMMA8_ATTRS = {**WGMMA_ATTRS, "operand_sources": {"a": ("shared",), "b": ("shared",)}, "k_major_only": True}


def _wgmma8_a() -> FragmentLayout:
    """The m64nNk32 8-bit A over a warpgroup (PTX ISA, "Register fragment for matrix A", .e4m3/.e5m2): per warp
    16 rows, element ``i`` of a lane in row ``lane / 4 + 8 (i / 4 % 2)``, column ``4 (lane % 4) + i % 4 + 16 (i / 8)``
    (data only: the 8-bit unit reads A from shared memory)."""
    return FragmentLayout((64, 32), [[("thread", 8, 4), ("reg", 2, 4), ("thread", 4, 32)],
                                     [("reg", 4, 1), ("thread", 4, 1), ("reg", 2, 8)]], name="wgmma8.A")


def wgmma_units() -> list:
    a, a8 = _mma_a(4), _wgmma8_a()
    out = []
    for n in range(8, 257, 8):
        b = FragmentLayout((16, n), [[("reg", 16, 1)], [("reg", n, 16)]], replicate=[(128, 1)],
                           name=f"wgmma_m64n{n}k16.B (shared memory)", opaque=True)
        out.append(MatrixUnit("wgmma", 64, n, 16, ("float16", "bfloat16"), "float32", 128, a, b,
                              wgmma_accumulator(n), f"wgmma_m64n{n}k16", attrs=WGMMA_ATTRS))
    for n in range(8, 257, 8):
        b = FragmentLayout((32, n), [[("reg", 32, 1)], [("reg", n, 32)]], replicate=[(128, 1)],
                           name=f"wgmma_m64n{n}k32.B (shared memory)", opaque=True)
        out.append(MatrixUnit("wgmma", 64, n, 32, ("float8_e4m3", "float8_e5m2"), "float32", 128, a8, b,
                              wgmma_accumulator(n), f"wgmma_m64n{n}k32", attrs=WGMMA8_ATTRS))
    return out


def units(target) -> list:
    """Every unit this plugin knows; the core keeps those the target's profile lists (tilecore.layout.units_for)."""
    return mma_16816_units() + wgmma_units()
