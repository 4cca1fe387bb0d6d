"""The QY2 (mp_22) matrix unit as data (:class:`tilecore.layout.MatrixUnit`): which lane of the 128-wide
warp and which of its registers hold each element of the 32x32x16 MMA atom (mute's
``MP22_32x32x16_F32F16F16F32_TN`` / ``_F32BF16BF16F32``, instruction ``__musa_fmma_m32n32k16_mma``).

Written from MooreThreads/tilelang_musa ``src/layout/gemm_layouts.cc`` (``makeGemmQY2FragmentA/B/C`` for
16-bit operands, the atom before it is repeated over warps), evaluated with TileLang's
``Fragment::Repeat`` (``repeat_on_thread`` adds ``threads x repeat index`` to the thread, otherwise
``registers x repeat index`` to the register; ``lower_dim_first`` numbers the repeats with the last
dimension fastest). ``lane`` is ``0 .. 127``:

- C (32 x 32 float32, 8 registers): row ``r0 + 4 r1 + 8 r2``, column ``c0 + 8 c1 + 16 c2`` is lane
  ``c0 + 8 r0 + 32 c1 + 64 r1``, register ``c2 + 2 r2`` (``makeGemmFragment4x8`` repeated 2x2 over
  threads, then 4x2 over registers);
- A (32 x 16, m x k, 4 registers): row ``r0 + 8 r1 + 16 r2``, k ``k0 + 2 k1 + 8 k2`` is lane
  ``k1 + 4 r0 + 32 k2 + 64 r1``, register ``k0 + 2 r2`` (``makeGemmFragment8x8`` repeated 2x2 over threads,
  then 2x1 over registers);
- B (16 x 32, k x n, 4 registers): k ``k0 + 2 k1 + 8 k2``, column ``n0 + 8 n1 + 16 n2`` is lane
  ``k1 + 4 n0 + 32 n1 + 64 k2``, register ``k0 + 2 n2`` (``makeGemmFragment8x8Transposed`` repeated 2x2
  over threads, then 1x2 over registers).

No QY2 device has run these layouts in tilecore (there is none here): tests check them element by
element against the formulas above, which restate the fork's code.
"""
from __future__ import annotations

from tilecore.layout import FragmentLayout, MatrixUnit

F16 = ("float16",)  # the bfloat16 atom exists; its instruction flags were not read, so it is not registered
SPELLING = "mp22_mma_32x32x16"


def qy2_mma_32x32x16() -> MatrixUnit:
    c = FragmentLayout((32, 32), [[("thread", 4, 8), ("thread", 2, 64), ("reg", 4, 2)],
                                  [("thread", 8, 1), ("thread", 2, 32), ("reg", 2, 1)]], name=f"{SPELLING}.C")
    a = FragmentLayout((32, 16), [[("thread", 8, 4), ("thread", 2, 64), ("reg", 2, 2)],
                                  [("reg", 2, 1), ("thread", 4, 1), ("thread", 2, 32)]], name=f"{SPELLING}.A")
    b = FragmentLayout((16, 32), [[("reg", 2, 1), ("thread", 4, 1), ("thread", 2, 64)],
                                  [("thread", 8, 4), ("thread", 2, 32), ("reg", 2, 2)]], name=f"{SPELLING}.B")
    return MatrixUnit("mp22_mma", 32, 32, 16, F16, "float32", 128, a, b, c, SPELLING)


def units(target) -> list:
    """Every unit this plugin registers; the core keeps those the target's profile lists (QY2 only)."""
    return [qy2_mma_32x32x16()]
