"""The disk cache and kernel export, seen from separate processes as users would meet them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def py(code: str, cache_dir: Path, extra_env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TILECORE_CACHE_DIR": str(cache_dir), **(extra_env or {}),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


COMPILE = """
    import json, numpy as np
    from kernels_for_tests import vadd
    k = vadd(1000)
    a = np.arange(1000, dtype=np.float32); b = np.ones(1000, dtype=np.float32)
    assert np.array_equal(k(a, b), a + b)
    print(json.dumps({"from_cache": k.meta["from_cache"], "key": k.meta["key"]}))
"""


def test_second_process_loads_from_cache(tmp_path):
    first = py(COMPILE, tmp_path)
    assert first.returncode == 0, first.stderr
    second = py(COMPILE, tmp_path)
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a == {"from_cache": False, "key": a["key"]}
    assert b == {"from_cache": True, "key": a["key"]}


def test_options_change_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    import tilecore
    from kernels_for_tests import scale_kernel

    k1 = tilecore.compile(scale_kernel(2.0), target="cpu", out_idx=[1])
    k2 = tilecore.compile(scale_kernel(2.0), target="cpu", out_idx=[1], pass_configs={"tilecore.fast_math": True})
    k3 = tilecore.compile(scale_kernel(3.0), target="cpu", out_idx=[1])
    assert len({k1.meta["key"], k2.meta["key"], k3.meta["key"]}) == 3


def test_concurrent_writers_never_corrupt(tmp_path):
    code = COMPILE
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: py(code, tmp_path), range(4)))
    for r in results:
        assert r.returncode == 0, r.stderr
    entries = [p for p in (tmp_path / "kernels").glob("*/*") if not p.name.startswith(".")]
    assert len(entries) == 1
    leftovers = [p for p in (tmp_path / "kernels").glob("*/.*")]
    assert leftovers == []
    assert json.loads(py(COMPILE, tmp_path).stdout)["from_cache"] is True


def test_corrupt_entry_is_detected_and_rebuilt(tmp_path):
    first = json.loads(py(COMPILE, tmp_path).stdout)
    entry = tmp_path / "kernels" / first["key"][:2] / first["key"]
    binary = entry / "binary.bin"
    binary.write_bytes(binary.read_bytes()[:100])  # truncated, as after a crash or a full disk
    again = py(COMPILE, tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["from_cache"] is False
    assert json.loads(py(COMPILE, tmp_path).stdout)["from_cache"] is True
    (entry / "kernel.json").write_text("{not json")
    assert json.loads(py(COMPILE, tmp_path).stdout)["from_cache"] is False


def test_export_and_load_elsewhere_without_the_compiler(tmp_path):
    export = py("""
        from kernels_for_tests import vadd
        vadd(1000).export(r"%s")
    """ % (tmp_path / "vadd.tck"), tmp_path / "cache1")
    assert export.returncode == 0, export.stderr
    # A fresh process with an empty cache: loads and runs, never imports the language, the passes or tvm.
    run = py("""
        import sys, numpy as np, tilecore
        k = tilecore.load_kernel(r"%s")
        a = np.arange(1000, dtype=np.float32)
        assert np.array_equal(k(a, a), 2 * a)
        heavy = [m for m in ("tvm", "tilecore.language", "tilecore.passes") if m in sys.modules]
        print("heavy:", heavy, "source:", "tc_kernel" in k.get_kernel_source())
    """ % (tmp_path / "vadd.tck"), tmp_path / "cache2")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "heavy: [] source: True"


def test_loading_a_bad_file_names_the_problem(tmp_path):
    import pytest

    import tilecore
    from tilecore.errors import CacheError

    bad = tmp_path / "bad.tck"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CacheError, match="not a tilecore kernel file"):
        tilecore.load_kernel(bad)


def test_dump_ir_writes_every_pass_and_the_source(tmp_path, monkeypatch):
    import tilecore
    from kernels_for_tests import scale_kernel

    monkeypatch.setenv("TILECORE_DUMP_IR", str(tmp_path / "dump"))
    k = tilecore.compile(scale_kernel(2.0), target="cpu", out_idx=[1])
    files = sorted(p.name for p in (tmp_path / "dump" / "scale").iterdir())
    assert files[0] == "00_input.ir" and "final.c" in files
    assert any("tile-lowering.tilecore.lower_tile_ops" in f for f in files)
    assert any("legalize.tilecore.check_capabilities" in f for f in files)
    x = np.random.default_rng(0).standard_normal((70, 64)).astype(np.float32)
    np.testing.assert_allclose(k(x), 2 * x, rtol=0, atol=0)


def test_changed_compiler_code_never_loads_an_entry_built_by_the_old_code(tmp_path, monkeypatch):
    # Seen: after the name-capture fix, kernels compiled before it (same IR, same version) still came from
    # the cache with the old wrong indexing (TileLang's linear_attn_fwd gave wrong O and final_state).
    import tilecore_cpu

    first = py(COMPILE, tmp_path / "cache")
    assert json.loads(first.stdout)["from_cache"] is False, first.stderr
    edited = tmp_path / "edited"
    shutil.copytree(Path(tilecore_cpu.__file__).parent, edited / "tilecore_cpu",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(edited / "tilecore_cpu" / "codegen.py", "a") as f:
        f.write("\n# an edit to the backend, as a fix would make (its version stays the same)\n")
    with monkeypatch.context() as m:
        m.setenv("PYTHONPATH", os.pathsep.join([str(edited), os.environ.get("PYTHONPATH", "")]))
        moved = py(COMPILE + "    import tilecore_cpu; assert tilecore_cpu.__file__.startswith(%r)\n" % str(edited),
                   tmp_path / "cache")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["from_cache"] is False
    assert json.loads(py(COMPILE, tmp_path / "cache").stdout)["from_cache"] is True
