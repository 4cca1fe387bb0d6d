"""Bad input gets a clear error naming the problem and the user's line, never a crash or a wrong answer."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.errors import ArgumentError, ParseError, TileOpShapeError, UnsupportedFeatureError


def line_of(fn, text: str) -> int:
    src, start = inspect.getsourcelines(fn)
    for i, line in enumerate(src):
        if text in line:
            return start + i
    raise AssertionError(text)


def test_gemm_with_unequal_k_fails_at_compile_time_naming_op_and_line():
    def build():
        @T.prim_func
        def bad_gemm(A: T.Tensor((64, 32), "float16"), B: T.Tensor((16, 64), "float16"),
                     C: T.Tensor((64, 64), "float32")):
            with T.Kernel(1, threads=128) as bx:
                A_s = T.alloc_shared((64, 32), "float16")
                B_s = T.alloc_shared((16, 64), "float16")
                C_l = T.alloc_fragment((64, 64), "float32")
                T.copy(A, A_s)
                T.copy(B, B_s)
                T.gemm(A_s, B_s, C_l)  # K: 32 vs 16
                T.copy(C_l, C)
        return bad_gemm

    with pytest.raises(TileOpShapeError) as e:
        build()
    msg = str(e.value)
    assert "T.gemm" in msg and "K differs" in msg and "(64, 32)" in msg and "(16, 64)" in msg
    assert f"test_errors.py:{line_of(build, 'T.gemm(A_s, B_s, C_l)')}" in msg


def test_copy_shape_mismatch_names_both_regions():
    with pytest.raises(TileOpShapeError, match=r"T\.copy.*\(32, 32\).*\(32, 16\)"):
        @T.prim_func
        def bad_copy(A: T.Tensor((64, 64), "float32")):
            with T.Kernel(1) as bx:
                s = T.alloc_shared((32, 16), "float32")
                T.copy(A[0:32, 0:32], s)


def test_reduce_destination_shape_is_checked():
    with pytest.raises(TileOpShapeError, match="reduce_sum"):
        @T.prim_func
        def bad_reduce(A: T.Tensor((64, 64), "float32")):
            with T.Kernel(1) as bx:
                f = T.alloc_fragment((64, 64), "float32")
                r = T.alloc_fragment((32,), "float32")
                T.reduce_sum(f, r, dim=1)


def test_rebinding_an_outer_name_in_a_loop_is_refused():
    with pytest.raises(ParseError, match="T.alloc_var"):
        @T.prim_func
        def loop_carried(A: T.Tensor((64,), "float32"), B: T.Tensor((1,), "float32")):
            with T.Kernel(1) as bx:
                acc = A[0]
                for i in T.serial(64):
                    acc = acc + A[i]
                B[0] = acc


def test_unknown_names_are_reported_with_the_line():
    with pytest.raises(ParseError, match=r"NameError: name 'undefined_thing' is not defined"):
        @T.prim_func
        def typo(A: T.Tensor((64,), "float32")):
            with T.Kernel(1) as bx:
                A[0] = undefined_thing  # noqa: F821


def test_missing_annotation_is_explained():
    with pytest.raises(ParseError, match="needs an annotation"):
        @T.prim_func
        def no_ann(A):
            with T.Kernel(1) as bx:
                pass


@pytest.fixture
def acme(tmp_path):
    """A second backend (test-only) whose capability profile lacks atomics, printf, float64 and fp16 mma."""
    import importlib
    import sys

    import fake_plugins
    from tilecore.plugin import get_registry
    from tilecore.plugin.capabilities import clear_cache

    reg = get_registry()
    reg.load()  # entry points first, so the module below is only registered in code
    (tmp_path / "tc_fake_acme_inproc.py").write_text(fake_plugins.ACME_MODULE)
    (tmp_path / "acme_x1.yaml").write_text(fake_plugins.ACME_CAPS)
    sys.path.insert(0, str(tmp_path))
    module = importlib.import_module("tc_fake_acme_inproc")
    rec = reg.register(module, name="acme-inproc")
    clear_cache()
    assert rec.status == "ok", rec.error
    yield "acme:x1"
    reg.unregister("acme-inproc")
    clear_cache()
    sys.path.remove(str(tmp_path))
    sys.modules.pop("tc_fake_acme_inproc", None)


def test_feature_the_target_lacks_fails_naming_feature_target_and_line(acme):
    def build():
        @T.prim_func
        def histogram(X: T.Tensor((256,), "int32"), H: T.Tensor((16,), "int32")):
            with T.Kernel(1) as bx:
                for i in T.serial(256):
                    T.atomic_add(H[X[i] % 16], 1)
        return histogram

    func = build()
    with pytest.raises(UnsupportedFeatureError) as e:
        tilecore.compile(func, target=acme)
    msg = str(e.value)
    assert e.value.feature == "feature:atomics" and e.value.target == "acme:x1"
    assert "acme:x1" in msg and "feature:atomics" in msg and "acme/x1" in msg
    assert f"test_errors.py:{line_of(build, 'T.atomic_add')}" in msg
    # the same kernel compiles and runs on the reference target
    k = tilecore.compile(func, target="cpu")
    x = np.arange(256, dtype=np.int32)
    h = np.zeros(16, dtype=np.int32)
    k(x, h)
    assert h.tolist() == [16] * 16


@pytest.mark.parametrize("what", ["float64", "mma_fp16", "printf", "threads", "shared_bytes"])
def test_each_missing_capability_is_named(acme, what):
    dtype = "float64" if what == "float64" else "float32"

    @T.prim_func
    def k(A: T.Tensor((64, 64), dtype), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=512 if what == "threads" else 128) as bx:
            if what == "mma_fp16":
                a = T.alloc_shared((64, 64), "float16")
                c = T.alloc_fragment((64, 64), "float32")
                T.gemm(a, a, c)
            if what == "printf":
                T.print(A[0, 0])
            if what == "shared_bytes":
                big = T.alloc_shared((128, 64), "float32")  # 32 KiB > 16 KiB
                T.copy(A, big[0:64, :])
            C[0, 0] = 0.0

    expected = {"float64": "dtype:float64:storage", "mma_fp16": "dtype:float16:mma", "printf": "feature:printf",
                "threads": "limit:max_threads_per_block", "shared_bytes": "limit:max_shared_bytes_per_block"}[what]
    with pytest.raises(UnsupportedFeatureError) as e:
        tilecore.compile(k, target=acme)
    assert e.value.feature == expected
    assert "acme:x1" in str(e.value)


@pytest.fixture(scope="module")
def vadd_kernel():
    from kernels_for_tests import vadd

    return vadd(1000)


def test_wrong_dtype_names_the_argument(vadd_kernel):
    a = np.zeros(1000, np.float32)
    with pytest.raises(ArgumentError, match=r"argument 'B' has dtype float64, expected float32"):
        vadd_kernel(a, np.zeros(1000))


def test_wrong_shape_names_the_argument(vadd_kernel):
    a = np.zeros(1000, np.float32)
    with pytest.raises(ArgumentError, match=r"argument 'A' has shape \(999,\), expected a float32 tensor of shape \(1000\)"):
        vadd_kernel(np.zeros(999, np.float32), a)


def test_missing_argument_is_named(vadd_kernel):
    with pytest.raises(ArgumentError, match=r"missing argument 'B'.*outputs \['C'\] are allocated for you"):
        vadd_kernel(np.zeros(1000, np.float32))


def test_wrong_device_and_layout_are_named(vadd_kernel):
    torch = pytest.importorskip("torch")
    with pytest.raises(ArgumentError, match="argument 'A' is on device meta"):
        vadd_kernel(torch.empty(1000, device="meta"), torch.zeros(1000))
    strided = np.zeros(2000, np.float32)[::2]
    with pytest.raises(ArgumentError, match="argument 'A' is not contiguous"):
        vadd_kernel(strided, np.zeros(1000, np.float32))
    with pytest.raises(ArgumentError, match="argument 'A' must be a float32 tensor"):
        vadd_kernel([0.0] * 1000, np.zeros(1000, np.float32))


def test_conflicting_dynamic_dims_are_named():
    from kernels_for_tests import scale_kernel

    @T.prim_func
    def two(X: T.Tensor((T.dynamic("n"),), "float32"), Y: T.Tensor((T.dynamic("n"),), "float32")):
        with T.Kernel(1) as bx:
            Y[0] = X[0]

    # Two T.dynamic("n") are distinct symbols; one symbol shared by both tensors must agree.
    n = T.dynamic("n")

    @T.prim_func
    def same(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(1) as bx:
            Y[0] = X[0]

    k = tilecore.compile(same, target="cpu")
    with pytest.raises(ArgumentError, match=r"argument 'Y' dim 0 is 5, but 'n' is already 4"):
        k(np.zeros(4, np.float32), np.zeros(5, np.float32))
    assert scale_kernel  # imported for symmetry with other tests


def test_unknown_pass_config_is_refused():
    from kernels_for_tests import scale_kernel
    from tilecore.errors import CompileError

    with pytest.raises(CompileError, match="unknown pass config 'tilecore.fastmath'"):
        tilecore.compile(scale_kernel(1.0), target="cpu", pass_configs={"tilecore.fastmath": True})
    # TileLang's keys are accepted so that ported code runs
    tilecore.compile(scale_kernel(1.0), target="cpu", pass_configs={"tl.disable_tma_lower": True})


def test_kernel_without_source_text_is_a_clear_error():
    import subprocess
    import sys

    code = ("import tilecore.language as T\n"
            "@T.prim_func\n"
            "def k(A: T.Tensor((4,), 'float32')):\n"
            "    with T.Kernel(1) as bx:\n"
            "        T.fill(A, 1.0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ParseError" in r.stderr and "defined in a file" in r.stderr, r.stderr
