"""The AMD matrix units as data (:class:`tilecore.layout.MatrixUnit`): which lane of the wave and which of
its registers hold each operand and accumulator element.

Written from the CDNA3 ISA reference guide's "Dependent and independent matrix layouts" section (and
LLVM's AMDGPUUsage / the AMD matrix instruction calculator, which print the same tables), with
``lane`` in ``0 .. 63`` of a wave of 64 (CDNA) or ``0 .. 31`` of a wave of 32 (RDNA3 WMMA):

``v_mfma_f32_16x16x16_f16`` / ``_bf16`` (``bf16_1k`` on gfx90a), 4 16-bit elements per lane:

- A (16 x 16): element ``e`` of lane ``l`` is row ``l % 16``, column (k) ``4 (l / 16) + e``;
- B (16 x 16): row (k) ``4 (l / 16) + e``, column ``l % 16``;
- C (16 x 16, 4 float32): row ``4 (l / 16) + e``, column ``l % 16``.

``v_mfma_f32_16x16x32_f16`` / ``_bf16`` (gfx950) and ``v_mfma_f32_16x16x32_fp8_fp8`` / ``_bf8_bf8``
(gfx942, gfx950): the same with 8 elements per lane, k ``8 (l / 16) + e``; C unchanged.

``v_wmma_f32_16x16x16_f16_w32`` / ``_bf16_w32`` (gfx11, wave 32), 16 elements per lane:

- A: lane ``l`` holds row ``l % 16``, all 16 columns in its registers; lanes ``l`` and ``l + 16`` hold
  the same (the instruction reads both half-waves: a replicated layout);
- B: lane ``l`` holds column ``l % 16``, all 16 rows, replicated the same way;
- C (8 float32): register ``r`` of lane ``l`` is row ``2 r + l / 16``, column ``l % 16``.
"""
from __future__ import annotations

from tilecore.layout import FragmentLayout, MatrixUnit

F16 = ("float16", "bfloat16")
F8 = ("float8_e4m3", "float8_e5m2")


def mfma_16x16(k: int, dtypes: tuple, spelling: str) -> MatrixUnit:
    """An MFMA 16x16xk over a wave of 64: ``k / 4`` consecutive k per lane, 4 groups of 16 lanes along k."""
    per = k // 4
    a = FragmentLayout((16, k), [[("thread", 16, 1)], [("reg", per, 1), ("thread", 4, 16)]], name=f"{spelling}.A")
    b = FragmentLayout((k, 16), [[("reg", per, 1), ("thread", 4, 16)], [("thread", 16, 1)]], name=f"{spelling}.B")
    c = FragmentLayout((16, 16), [[("reg", 4, 1), ("thread", 4, 16)], [("thread", 16, 1)]], name=f"{spelling}.C")
    return MatrixUnit("mfma", 16, 16, k, dtypes, "float32", 64, a, b, c, spelling)


def wmma_16x16x16() -> MatrixUnit:
    """WMMA 16x16x16 over a wave of 32 (A and B replicated over the two half-waves)."""
    name = "wmma_f32_16x16x16_f16_w32"
    a = FragmentLayout((16, 16), [[("thread", 16, 1)], [("reg", 16, 1)]], replicate=[(2, 16)], name=f"{name}.A")
    b = FragmentLayout((16, 16), [[("reg", 16, 1)], [("thread", 16, 1)]], replicate=[(2, 16)], name=f"{name}.B")
    c = FragmentLayout((16, 16), [[("thread", 2, 16), ("reg", 8, 1)], [("thread", 16, 1)]], name=f"{name}.C")
    return MatrixUnit("wmma", 16, 16, 16, F16, "float32", 32, a, b, c, name)


def units(target) -> list:
    """Every unit this plugin knows, widest K first; the core keeps those the target's profile lists
    (``matrix_units`` with family, dtypes and shape), so one list serves every architecture."""
    return [mfma_16x16(32, F16, "mfma_f32_16x16x32_f16"), mfma_16x16(16, F16, "mfma_f32_16x16x16_f16"),
            mfma_16x16(32, F8, "mfma_f32_16x16x32_fp8"), wmma_16x16x16()]
