"""An index into an on-chip buffer that is out of range whenever it runs is refused at compile time, at
the user's line (issue 9); one that may be in range compiles."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tilecore
from tilecore.errors import CompileError

KERNELS = textwrap.dedent("""
    import tilecore.language as T

    @T.prim_func
    def const_index(A: T.Tensor((16,), "float32")):
        with T.Kernel(1) as bx:
            s = T.alloc_shared((16,), "float32")
            T.fill(s, 0.0)
            s[20] = 1.0
            T.copy(s, A)

    @T.prim_func
    def affine_index(A: T.Tensor((16,), "float32")):
        with T.Kernel(4) as bx:
            f = T.alloc_fragment((4, 16), "float32")
            T.fill(f, 0.0)
            for i in T.serial(4):
                f[bx + 4, i] = 1.0
            T.copy(f[0, :], A)

    @T.prim_func
    def load_index(A: T.Tensor((16,), "float32")):
        with T.Kernel(1) as bx:
            l = T.alloc_local((8,), "float32")
            T.fill(l, 0.0)
            for i in T.Parallel(16):
                A[i] = l[i // 2 - 8]

    @T.prim_func
    def region_overrun(A: T.Tensor((32,), "float32")):
        with T.Kernel(1) as bx:
            s = T.alloc_shared((16,), "float32")
            T.copy(A[0:16], s[8:24])
            T.copy(s, A[0:16])

    @T.prim_func
    def may_be_in_range(A: T.Tensor((16,), "float32"), n: T.int32):
        with T.Kernel(1) as bx:
            s = T.alloc_shared((16,), "float32")
            T.fill(s, 2.0)
            for i in T.serial(20):
                if i < 16:
                    s[i] = 1.0
            for i in T.serial(n):
                s[i + 1] = 3.0
            T.copy(s, A)
""")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    path = tmp_path_factory.mktemp("bounds") / "kernels.py"
    path.write_text(KERNELS)
    import importlib.util

    spec = importlib.util.spec_from_file_location("bounds_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def _line(path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("name, line, what", [
    ("const_index", "s[20] = 1.0", "index 20 is always out of range for shared buffer s of shape (16,): "
                                   "dimension 0 holds indices 0..15"),
    ("affine_index", "f[bx + 4, i] = 1.0", "index (bx + 4) (from 4 to 7) is always out of range for fragment "
                                           "buffer f of shape (4, 16): dimension 0 holds indices 0..3"),
    ("load_index", "A[i] = l[i // 2 - 8]", "is always out of range for local buffer l of shape (8,)"),
    ("region_overrun", "T.copy(A[0:16], s[8:24])", "region 8:+16 is always out of range for shared buffer s"),
])
def test_static_out_of_range_on_chip_index_is_refused_at_the_users_line(kernels, name, line, what):
    path, mod = kernels
    with pytest.raises(CompileError) as err:
        tilecore.compile(getattr(mod, name), target="cpu")
    assert what in str(err.value)
    assert f"kernels.py:{_line(path, line)} in {name}:" in str(err.value)
    assert "Fix the index or enlarge the buffer" in str(err.value)


def test_an_index_that_may_be_in_range_compiles_and_runs(kernels):
    _, mod = kernels
    k = tilecore.compile(mod.may_be_in_range, target="cpu")
    a = np.full(16, np.nan, np.float32)
    k(a, 3)
    np.testing.assert_array_equal(a, [1.0] + [3.0] * 3 + [1.0] * 12)


def test_cli_names_the_line_in_one_line_without_a_traceback(kernels):
    path, _ = kernels
    r = subprocess.run([sys.executable, "-m", "tilecore", "compile", f"{path}:const_index", "--emit", "source",
                        "--target", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f"kernels.py:{_line(path, 's[20] = 1.0')} in const_index: index 20 is always out of range" in r.stderr
