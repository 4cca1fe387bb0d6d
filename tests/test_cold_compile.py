"""Cold compile (issue 17, decision D48): the phases a compile reports, plugin records that read no package
metadata until asked, autotune's worker processes and their fallback, and benchmarks/cold_compile.py itself
(pinned children, every phase in its table). Nothing here times anything against a bound."""
from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tilecore
import tilecore.language as T
from tilecore.plugin import registry as registry_mod

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
BUILD_PHASES = {"plugins", "capabilities", "toolchain", "key", "passes", "codegen", "build", "store"}


def scale_kernel(n=256, block=64, factor=2.0):
    @T.prim_func
    def scale(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block)) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * factor
    return scale


def test_compile_times_name_every_phase_and_stay_out_of_exports(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path / "cache"))
    t = time.perf_counter()
    k = tilecore.compile(scale_kernel(factor=3.0), target="cpu", out_idx=[-1])
    wall = time.perf_counter() - t
    times = k.compile_times
    assert set(times) == BUILD_PHASES and all(v >= 0 for v in times.values())
    assert sum(times.values()) <= wall and times["build"] > 0  # the C compiler ran, inside the compile
    a = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(k(a), 3 * a)
    hit = tilecore.compile(scale_kernel(factor=3.0), target="cpu", out_idx=[-1])
    assert hit.meta["from_cache"] and set(hit.compile_times) == {"plugins", "capabilities", "toolchain", "key"}
    path = k.export(tmp_path / "k.tck")
    with zipfile.ZipFile(path) as z:
        info = json.loads(z.read("kernel.json"))
    assert "compile_times" not in info["meta"] and info["meta"]["name"] == k.name
    assert tilecore.load_kernel(path).compile_times == {}


@pytest.mark.parametrize("lazy", [True, False])
def test_plugin_records_read_no_package_metadata_until_asked(monkeypatch, lazy):
    """Loading the plugins parses no METADATA file (D48); with LAZY_RECORDS off (as before D48) the same spy sees
    every plugin's, which proves the spy sees them. Asked, a record gives its distribution's name and version."""
    reads = []
    real = importlib.metadata.PathDistribution.read_text

    def spy(self, filename):
        if filename in ("METADATA", "PKG-INFO"):
            reads.append(filename)
        return real(self, filename)

    monkeypatch.setattr(importlib.metadata.PathDistribution, "read_text", spy)
    monkeypatch.setattr(registry_mod, "LAZY_RECORDS", lazy)
    reg = registry_mod.Registry()
    try:
        reg.load()
        recs = [r for r in reg.plugins() if r.status == "ok"]
        assert any(r.name == "cpu" for r in recs)
        assert (reads == []) == lazy, reads
        cpu = next(r for r in recs if r.name == "cpu")
        dist = importlib.metadata.distribution(cpu.distribution)
        assert (cpu.distribution, cpu.version) == (dist.metadata["Name"], dist.version)
        assert reads  # asked: read now
    finally:
        for rec in list(reg.plugins()):
            reg.unregister(rec.name)


def test_a_plugin_registered_in_code_takes_its_backends_version_when_asked():
    from tilecore.plugin import Backend, Target, hookimpl

    class Inline(Backend):
        name = "inline-d48"
        plugin_api = "1.0"

        def parse_target(self, spec):
            return Target("inline-d48", "inline-d48") if spec == "inline-d48" else None

        def targets(self):
            return ["inline-d48"]

        def version(self):
            return "9.8.7"

        def emitter(self, target):
            raise NotImplementedError

        def runtime(self, target):
            raise NotImplementedError

    class Plugin:
        @hookimpl
        def tilecore_backends(self):
            return [Inline()]

    reg = registry_mod.Registry(autoload=False)
    rec = reg.register(Plugin(), name="inline-d48")
    assert rec.status == "ok" and [b.name for b in rec.backends] == ["inline-d48"]
    assert rec.version == "9.8.7" and rec.distribution == ""
    reg.unregister("inline-d48")
    given = reg.register(Plugin(), name="given", distribution="tilecore-given", version="1.2")
    assert given.status == "ok" and (given.version, given.distribution) == ("1.2", "tilecore-given")


def make_tuned(log):
    @tilecore.autotune(configs=[{"block": 32}, {"block": 64}], warmup=1, rep=2)
    @tilecore.jit(out_idx=[-1], target="cpu")
    def scale(n, block=32):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return scale_kernel(n, block)
    return scale


@pytest.mark.parametrize("processes", ["1", "0"])
def test_autotune_compiles_in_worker_processes_or_threads_when_told(tmp_path, monkeypatch, processes):
    """Issue 17's 'parallel compilation in @tilecore.autotune across processes' (D19): every config compiles in a
    forked worker; TILECORE_AUTOTUNE_PROCESSES=0 keeps them in this process (threads)."""
    if "fork" not in multiprocessing.get_all_start_methods() or (os.cpu_count() or 1) < 2:
        pytest.skip("no fork or one CPU: autotune compiles in threads here by design")
    monkeypatch.setenv("TILECORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILECORE_AUTOTUNE_PROCESSES", processes)
    log = tmp_path / "pids.txt"
    k = make_tuned(log)(256)
    pids = [int(p) for p in log.read_text().split()]
    assert len(pids) == 2
    if processes == "1":
        assert os.getpid() not in pids
    else:
        assert set(pids) == {os.getpid()}
    a = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(k(a), 2 * a)


# -- the benchmark ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import cold_compile

        yield cold_compile
    finally:
        sys.path.remove(str(BENCH))


def test_benchmark_reads_nvrtc_and_nvcc_time_tables(bench, tmp_path):
    nvrtc = tmp_path / "nvrtc.csv"
    nvrtc.write_text("tilecore_kernel.cu, CUDA C++ Frontend, 31.0000, ms\n"
                     "tilecore_kernel.cu, NVVM Optimizer, 150.5000, ms\n"
                     "tilecore_kernel.cu, PTX Translation, 200.2500, ms\n")
    assert bench.phases(nvrtc) == {"CUDA C++ Frontend": 31.0, "NVVM Optimizer": 150.5, "PTX Translation": 200.25}
    nvcc = tmp_path / "nvcc.csv"
    nvcc.write_text("source file name , phase name , phase input files , phase output file , arch , tool, metric , unit\n"
                    "k.cu , gcc (preprocessing 1) , k.cu  , k.ii , compute_90a , nvcc , 299.4070 , ms\n"
                    "k.cu , cicc , k.ii  , k.ptx , compute_90a , nvcc , 1137.9141 , ms\n"
                    "k.cu , ptxas , k.ptx  , k.cubin , sm_90a , nvcc , 587.1390 , ms\n")
    got = bench.phases(nvcc)
    assert got["cicc"] == 1137.9141 and got["ptxas"] == 587.139 and got["gcc (preprocessing 1)"] == 299.407
    assert bench.phases(tmp_path / "absent.csv") == {}


def test_benchmark_pins_to_the_last_cpus(bench):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform: the benchmark runs unpinned")
    mine = sorted(os.sched_getaffinity(0))
    assert bench.cpu_set("1") == mine[-1:]
    assert bench.cpu_set("2") == mine[-2:]
    assert bench.cpu_set("all") == []
    assert bench.cpu_set("0,1") == [0, 1]


def test_benchmark_runs_pinned_and_tables_every_phase(tmp_path):
    """One fresh process (plus its warm-up) of one variant: exits 0, its children were pinned to one CPU, the
    phase table has every phase. Needs NVRTC (no GPU)."""
    import tilecore_cuda.compiler as cc

    if not cc.nvrtc_usable():
        pytest.skip("NVRTC is not installed here (scripts/setup.sh installs it): the benchmark measures NVRTC")
    env = {k: v for k, v in os.environ.items() if k != "TILECORE_PASS_CONFIGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # a small kernel on the same path (the core's general path: TMA + WGMMA, bulk store; D65) keeps the test short
    proc = subprocess.run([sys.executable, str(BENCH / "cold_compile.py"), "--repeat", "1", "--variants",
                           "default,before-d48", "--cpus", "1", "--no-launch", "--kernel",
                           "256,256,256,128,128,64,256,2"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if mine:
        assert f"pinned to CPU {mine[-1]} " in out
    for row in ("import tilecore", "parse (@T.prim_func)", "plugins", "capabilities", "toolchain", "key", "passes",
                "codegen", "build: front end", "build: NVVM", "build: ptxas", "build: other", "rest of compile"):
        assert f"| {row} | " in out, row
    assert "| the default (the core's general path, D65) | " in out  # the plain 16-bit GEMM routed by default
    assert "| the default, D48's changes undone | " in out


def test_cuda_build_flags_stay_whole_program_and_optimized():
    """The flags D48 measured against: NVRTC's --minimal, whole-program (no -rdc / -dc: a relocatable build would add
    a link step), no line info or device debug unless tilecore.debug, ptxas at its default -O3."""
    import tilecore_cuda.compiler as cc

    flags = [*cc.NVRTC_FLAGS, *cc._flags({})]
    assert "--minimal" in flags and "-std=c++17" in flags
    assert not [f for f in flags if f.startswith(("-rdc", "--relocatable-device-code", "-dc", "--device-c", "-G",
                                                   "--device-debug", "-lineinfo", "--Ofast-compile"))], flags
    assert not [f for f in flags if "-O" in f and f != "--ptxas-options=-v"], flags
    assert "-lineinfo" in cc._flags({"tilecore.debug": True})
