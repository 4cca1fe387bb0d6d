"""Build MUSA C++: with ``mcc`` (Moore Threads' clang-based compiler, MUSA SDK) where it exists, else check it.

- ``mcc -x musa --cuda-device-only --cuda-gpu-arch=mp_XX -O3`` gives the device binary (``$TILECORE_MUSA_MCC``
  names another mcc; the SDK's default is ``/usr/local/musa/bin/mcc``). Written from the SDK's documented
  command line; no mcc was reachable when this was written, so this path has not run.
- Without mcc (mode ``codegen-only``) ``compile`` returns the checked source bytes: the structural checks
  of :mod:`tilecore_musa.structure` always, and, when ``$TILECORE_MUSA_STUB`` names a folder holding a MUSA
  stub header (``musa_stub.h``, ``musa_fp16.h``, ``musa_bf16.h``: the backend's tests keep one), a syntax
  and type check by clang in CUDA mode against it (``-x cuda -nocudainc -nocudalib -fsyntax-only``, with
  ``__MUSA_ARCH__`` set to the target's). A rejected kernel is a :class:`CompileError` with the message.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tilecore.errors import CompileError
from tilecore.plugin import Compiler, Source
from tilecore.runtime.tools import find_program

from . import structure

MCC_CANDIDATES = ("mcc", "/usr/local/musa/bin/mcc")
CLANGS = ("clang++-22", "clang++-21", "clang++-20", "clang++-19", "clang++")
MCC_HINT = "install the MUSA SDK (mcc, libmusa) from Moore Threads, or set $TILECORE_MUSA_MCC to its mcc"


@functools.lru_cache(maxsize=1)
def find_mcc() -> str | None:
    return find_program(MCC_CANDIDATES, env="TILECORE_MUSA_MCC")


@functools.lru_cache(maxsize=1)
def find_clang() -> str | None:
    return find_program(CLANGS, env="TILECORE_MUSA_CLANG")


def _version(tool: str | None) -> str:
    if not tool:
        return ""
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0].strip() if out else ""


@functools.lru_cache(maxsize=1)
def mcc_version() -> str:
    return _version(find_mcc())


def stub_dir() -> str | None:
    d = os.environ.get("TILECORE_MUSA_STUB")
    return d if d and Path(d, "musa_stub.h").exists() else None


def syntax_flags(arch: str, stub: str) -> list:
    """clang in CUDA mode against the stub: no CUDA headers or libraries, ``__MUSA_ARCH__`` of the target."""
    return ["-x", "cuda", "-nocudainc", "-nocudalib", "--cuda-gpu-arch=sm_80", "--cuda-device-only", "-fsyntax-only",
            "-std=c++17", "-Wno-unknown-cuda-version", "-Werror=implicit-function-declaration",
            f"-D__MUSA_ARCH__={int(arch.split('_')[1]) * 10}", f"-I{stub}", "-include", "musa_stub.h"]


def syntax_check(code: str, arch: str, stub: str, clang: str | None = None) -> None:
    """Raise CompileError with clang's message when the source fails the stub check."""
    clang = clang or find_clang()
    if clang is None:
        raise CompileError("the MUSA stub check needs clang++ (apt-get install clang-22)")
    with tempfile.TemporaryDirectory(prefix="tilecore-musa-check-") as tmp:
        src = Path(tmp) / "kernel.mu"
        src.write_text(code)
        proc = subprocess.run([clang, *syntax_flags(arch, stub), str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"clang (CUDA mode, MUSA stub {stub}) rejected the generated MUSA code for {arch}:\n"
                               f"{proc.stderr.strip()[-4000:]}\nThis is a tilecore bug; please report it")


class MUSACompiler(Compiler):
    def __init__(self, arch: str = "mp_31", capabilities=None):
        self.arch = arch
        self.capabilities = capabilities

    def version(self) -> str:
        mcc = mcc_version()
        if mcc:
            return mcc
        stub = stub_dir()
        return f"codegen-only (structure{'; clang stub check ' + _version(find_clang()) if stub else ''})"

    def compile(self, source: Source, options: dict) -> bytes:
        arch = source.meta.get("arch") or self.arch
        problems = structure.check(source.code, source.meta, self.capabilities)
        if problems:
            raise CompileError(f"the generated MUSA code for {arch} fails tilecore-musa's structural checks:\n  "
                               + "\n  ".join(problems) + "\nThis is a tilecore bug; please report it")
        mcc = find_mcc()
        if mcc is None:
            stub = stub_dir()
            if stub:
                syntax_check(source.code, arch, stub)
            return source.code.encode()
        tmp = Path(tempfile.mkdtemp(prefix="tilecore-musa-build-"))
        src, out = tmp / "kernel.mu", tmp / "kernel.mubin"
        src.write_text(source.code)
        flags = ["-x", "musa", "--cuda-device-only", f"--cuda-gpu-arch={arch}", "-std=c++17",
                 "-O3" if not options.get("tilecore.debug") else "-g"]
        if options.get("tilecore.fast_math"):
            flags.append("-ffast-math")
        proc = subprocess.run([mcc, *flags, *options.get("tilecore.extra_flags", ()), str(src), "-o", str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"mcc rejected the generated MUSA code for {arch} (source: {src}):\n"
                               f"{proc.stderr.strip()[-4000:]}\nThis is a tilecore bug; please report it with "
                               "that file")
        binary = out.read_bytes()
        shutil.rmtree(tmp, ignore_errors=True)
        return binary
