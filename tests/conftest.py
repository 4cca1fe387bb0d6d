"""Shared fixtures of the kernel correctness tests (target "cpu", public API only).

- Every test session compiles into a private kernel cache (``TILECORE_CACHE_DIR``), shared by the
  xdist workers of one run so a kernel that two workers need is built once, and never reusing the
  user's own cache.
- ``rng`` is a numpy Generator seeded from the test's node id: fresh inputs per test, reproducible runs.
- ``nan_like`` / ``poison`` give output buffers filled with NaN (or an integer sentinel) so that an
  element the kernel never writes fails the comparison instead of passing by luck.
"""
from __future__ import annotations

import os
import tempfile
import zlib

import numpy as np
import pytest

# Set at import as well, so that nothing compiled while collecting can touch the user's cache (the
# session fixture below replaces it with a directory pytest cleans up; the cache creates it on demand).
os.environ["TILECORE_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"tilecore-test-cache-{os.getpid()}")

#: per input dtype: (rtol, atol per sqrt(K)) for results rounded to that dtype
TOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4, "float64": 1e-10}


@pytest.fixture(scope="session", autouse=True)
def kernel_cache_dir(tmp_path_factory, request):
    """A fresh kernel cache for this run, shared by all xdist workers of the run."""
    base = tmp_path_factory.getbasetemp()
    under_xdist = getattr(request.config, "workerinput", None) is not None
    root = (base.parent if under_xdist else base) / "tilecore-cache"
    root.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TILECORE_CACHE_DIR")
    os.environ["TILECORE_CACHE_DIR"] = str(root)
    yield root
    if old is not None:
        os.environ["TILECORE_CACHE_DIR"] = old


#: modules that test the CUDA register programs' own kernels (FlashAttention's forms among them): they compile with
#: tilecore.cuda.register_programs=True whatever the route's default (the mma.sync program on sm_80; D86 retired the
#: WGMMA one, whose form True now refuses on sm_90a)
REGISTER_PROGRAM_MODULES = frozenset({
    "test_cuda_attention_critical_path", "test_cuda_attention_lean", "test_cuda_attention_softmax",
    "test_cuda_epilogue_fold", "test_cuda_exp2_poly", "test_cuda_exp2_rows", "test_cuda_hopper", "test_cuda_row_division"})


@pytest.fixture(autouse=True)
def _register_programs_pinned(request, monkeypatch):
    """REGISTER_PROGRAM_MODULES' tests: ``tilecore.cuda.register_programs=True`` in every compile's defaults (the
    process's TILECORE_PASS_CONFIGS, a compile's own configs still win)."""
    if request.module.__name__.rsplit(".", 1)[-1] in REGISTER_PROGRAM_MODULES:
        import json

        env = json.loads(os.environ.get("TILECORE_PASS_CONFIGS") or "{}")
        monkeypatch.setenv("TILECORE_PASS_CONFIGS", json.dumps({**env, "tilecore.cuda.register_programs": True}))
    yield


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A numpy Generator seeded from the test's node id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def poison(x):
    """Fill an output buffer in place with NaN (floats) or a sentinel (ints); returns it."""
    if _is_torch(x):
        import torch

        x.fill_(float("nan") if x.dtype.is_floating_point else -12345 if x.dtype != torch.bool else True)
        return x
    if np.issubdtype(x.dtype, np.floating):
        x.fill(np.nan)
    else:
        x.fill(-12345 if np.issubdtype(x.dtype, np.signedinteger) else 123)
    return x


def nan_like(shape, dtype, torch_tensor: bool = False):
    """A new NaN-filled output of ``shape``; ``dtype`` a name such as "float16" (bfloat16 gives torch)."""
    dtype = str(dtype)
    if torch_tensor or dtype == "bfloat16":
        import torch

        return poison(torch.empty(tuple(shape), dtype=getattr(torch, dtype)))
    return poison(np.empty(tuple(shape), dtype=np.dtype(dtype)))


def to_f64(x) -> np.ndarray:
    """numpy float64 copy of a numpy array or a CPU torch tensor (any dtype, bfloat16 included)."""
    if _is_torch(x):
        import torch

        return x.detach().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def randn(rng, shape, dtype, torch_tensor: bool = False, scale: float = 1.0):
    """Random normal input of a given dtype (numpy, or torch for bfloat16 / when asked)."""
    data = rng.standard_normal(tuple(shape)) * scale
    dtype = str(dtype)
    if torch_tensor or dtype == "bfloat16":
        import torch

        return torch.from_numpy(data).to(getattr(torch, dtype)).contiguous()
    return data.astype(dtype)


def assert_close(out, ref, rtol, atol, what=""):
    """Compare in float64; NaN anywhere in ``out`` (an unwritten element) fails."""
    o = to_f64(out)
    r = np.asarray(ref, dtype=np.float64)
    assert o.shape == r.shape, f"{what}: shape {o.shape} != {r.shape}"
    bad = ~np.isfinite(o) & np.isfinite(r)
    assert not bad.any(), f"{what}: {int(bad.sum())} non-finite elements (first at {np.argwhere(bad)[0].tolist()})"
    np.testing.assert_allclose(o, r, rtol=rtol, atol=atol, err_msg=what)
