"""Regression tests for bugs found in review (each names what went wrong)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import UnsupportedFeatureError


def test_ampersand_on_integers_is_bitwise_not_logical():
    @T.prim_func
    def bits(A: T.Tensor((4,), "int32"), B: T.Tensor((4,), "int32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                B[i] = (A[i] & 6) | (A[i] << 4) ^ ~A[i]

    k = tilecore.compile(bits, target="cpu")
    a = np.array([5, 3, -7, 12], np.int32)
    b = np.zeros(4, np.int32)
    k(a, b)
    np.testing.assert_array_equal(b, (a & 6) | (a << 4) ^ ~a)


def test_statically_out_of_bounds_fill_writes_nothing():
    @T.prim_func
    def oob(B: T.Tensor((12,), "float32")):
        with T.Kernel(1) as bx:
            T.fill(B[20], 1.0)
            T.fill(B[8:16], 2.0)

    k = tilecore.compile(oob, target="cpu")
    b = np.zeros(12, np.float32)
    k(b)
    np.testing.assert_array_equal(b, [0] * 8 + [2] * 4)


def test_global_to_global_copy_skips_elements_outside_the_source():
    @T.prim_func
    def g2g(A: T.Tensor((10,), "float32"), B: T.Tensor((16,), "float32")):
        with T.Kernel(1) as bx:
            T.copy(A[4], B[0:16])

    k = tilecore.compile(g2g, target="cpu")
    a = np.arange(10, dtype=np.float32)
    b = np.full(16, -1.0, np.float32)
    k(a, b)
    np.testing.assert_array_equal(b, list(range(4, 10)) + [-1] * 10)


def test_ieee_rounding_mode_is_checked_wherever_the_value_goes():
    @T.prim_func
    def rz(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                s = T.ieee_add(A[i], 1.0, rounding="rz")   # bound to a name, not stored directly
                B[i] = s

    with pytest.raises(UnsupportedFeatureError, match="feature:rounding_rz"):
        tilecore.compile(rz, target="cpu")


def test_min_and_max_value_are_finite_for_floats():
    @T.prim_func
    def extremes(B: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            B[0] = T.min_value("float32")
            B[1] = T.max_value("float32")
            B[2] = T.max_value("float16")
            B[3] = T.min_value("int8")

    b = np.zeros(4, np.float32)
    tilecore.compile(extremes, target="cpu")(b)
    assert b.tolist() == [float(np.finfo(np.float32).min), float(np.finfo(np.float32).max), 65504.0, -128.0]


def test_trace_plugins_prints_hook_calls():
    env = {**os.environ, "TILECORE_TRACE_PLUGINS": "1"}
    r = subprocess.run([sys.executable, "-m", "tilecore", "targets", "list", "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0
    assert "[tilecore plugins] cpu.tilecore_backends() -> [" in r.stderr


def test_pipeline_hook_returning_none_is_tolerated():
    from tilecore.plugin import get_registry, hookimpl

    class Quiet:
        @hookimpl
        def tilecore_pipeline_passes(self, target):
            return None

    reg = get_registry()
    reg.register(Quiet(), name="quiet")
    try:
        from kernels_for_tests import scale_kernel

        tilecore.compile(scale_kernel(1.5), target="cpu", pass_configs={"tilecore.disable_cache": True})
    finally:
        reg.unregister("quiet")


def test_elementwise_max_and_min_propagate_nan():
    """T.max / T.min on floats return NaN for a NaN operand, as torch.maximum / minimum (issue 9)."""
    @T.prim_func
    def mm(A: T.Tensor((4,), "float32"), B: T.Tensor((4,), "float32"), C: T.Tensor((4,), "float32")):
        with T.Kernel(1) as bx:
            for i in T.serial(4):
                B[i] = T.max(A[i], 0.0)
                C[i] = T.min(1.0, A[i])

    k = tilecore.compile(mm, target="cpu")
    a = np.array([np.nan, -2.0, 3.0, np.nan], np.float32)
    b, c = np.zeros(4, np.float32), np.zeros(4, np.float32)
    k(a, b, c)
    np.testing.assert_array_equal(b, [np.nan, 0.0, 3.0, np.nan])
    np.testing.assert_array_equal(c, [np.nan, -2.0, 1.0, np.nan])
