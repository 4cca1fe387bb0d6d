"""The simdgroup matrix as a core matrix unit (:class:`tilecore.layout.MatrixUnit`) with opaque layouts.

``simdgroup_matrix<T, 8, 8>`` (MSL specification, "SIMD-group matrix functions") is one 8x8 tile held by
the 32 threads of a simdgroup, two elements per thread; which two is not specified (``thread_elements()``
hands a thread its own without saying where they sit). The layouts registered here therefore say only
what the hardware promises, the shape and the group, and are ``opaque``: the core never computes an
element's thread from them (:meth:`~tilecore.layout.FragmentLayout.locate` refuses), never puts such a
fragment in per-thread registers, and keeps the accumulator in threadgroup memory wherever its elements
are accessed; ``T.gemm`` itself runs on the unit through ``metal.gemm_simdgroup`` (intrinsics.py), which
loads, multiplies and stores whole tiles. The digits below (8 threads down the rows, 4 across, 2 registers)
only give the right counts: 32 threads x 2 registers.
"""
from __future__ import annotations

from tilecore.layout import FragmentLayout, MatrixUnit

SPELLING = "simdgroup_matrix_8x8x8"


def _opaque(role: str) -> FragmentLayout:
    return FragmentLayout((8, 8), [[("thread", 8, 4)], [("reg", 2, 1), ("thread", 4, 1)]],
                          name=f"{SPELLING}.{role}", opaque=True)


def units(target) -> list:
    """The unit for every operand dtype a family may have (float16, float32; bfloat16 where the profile
    declares it, Apple9 with MSL 3.1); the core keeps those the profile lists under ``matrix_units``."""
    return [MatrixUnit("simdgroup_matrix", 8, 8, 8, dtypes, "float32", 32, _opaque("A"), _opaque("B"), _opaque("C"),
                       SPELLING, attrs={"opaque": True})
            for dtypes in (("float16",), ("float32",), ("bfloat16",))]
