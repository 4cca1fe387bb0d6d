"""Build HIP C++ to an AMDGPU code object (HSA ELF) with clang, and disassemble one.

``clang++-22 -x hip --offload-arch=<arch> --cuda-device-only --no-gpu-bundle-output -nogpuinc -nogpulib
-O3``: the source is self-contained (the code generator inlines the preludes), so no ROCm install is
needed; kernels that call a math function of ROCm's device library get ``ocml.bc`` linked in
(``-Xclang -mlink-builtin-bitcode``; package ``rocm-device-libs``). ``$TILECORE_HIP_CLANG`` names another
clang (e.g. ROCm's ``/opt/rocm/llvm/bin/clang++``). Nothing here needs a GPU.
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

CLANGS = ("clang++-22", "/usr/lib/llvm-22/bin/clang++", "/opt/rocm/llvm/bin/clang++")
OBJDUMPS = ("llvm-objdump-22", "/usr/lib/llvm-22/bin/llvm-objdump", "/opt/rocm/llvm/bin/llvm-objdump")
BITCODE_DIRS = ("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/aarch64-linux-gnu/amdgcn/bitcode",
                "/opt/rocm/amdgcn/bitcode", "/opt/rocm/lib/llvm/lib/clang/amdgcn/bitcode")
INSTALL_HINT = ("apt-get install clang-22 lld-22 llvm-22 rocm-device-libs (Debian bookworm-security / "
                "apt.llvm.org), or set $TILECORE_HIP_CLANG to a clang++ with the AMDGPU target")


@functools.lru_cache(maxsize=1)
def find_clang() -> str | None:
    return find_program(CLANGS, env="TILECORE_HIP_CLANG")


@functools.lru_cache(maxsize=1)
def find_objdump() -> str | None:
    clang = find_clang()
    if clang:  # the objdump next to the compiler first: it knows the same architectures
        sib = Path(clang).resolve().parent / "llvm-objdump"
        if sib.exists():
            return str(sib)
    return find_program(OBJDUMPS)


@functools.lru_cache(maxsize=1)
def find_ocml() -> str | None:
    env = os.environ.get("TILECORE_HIP_DEVICE_LIBS")
    for d in ([env] if env else []) + list(BITCODE_DIRS):
        for name in ("ocml.bc", "ocml.amdgcn.bc"):
            if d and Path(d, name).exists():
                return str(Path(d, name))
    return None


@functools.lru_cache(maxsize=1)
def clang_version() -> str:
    clang = find_clang()
    if clang is None:
        return ""
    try:
        out = subprocess.run([clang, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    first = out.splitlines()[0].strip() if out else "clang (unknown version)"
    return first + (" + ocml" if find_ocml() else "")


def _flags(arch: str, options: dict, libs) -> list:
    out = ["-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpuinc",
           "-nogpulib", "-std=c++17", "-O3", "-Wno-unused-command-line-argument"]
    if options.get("tilecore.debug"):
        out.append("-g")
    out.append("-ffast-math" if options.get("tilecore.fast_math") else "-ffp-contract=off")
    if "ocml" in libs:
        ocml = find_ocml()
        if ocml is None:
            raise CompileError("this kernel calls a math function of ROCm's device library (ocml), which is not "
                               "installed: apt-get install rocm-device-libs, or set $TILECORE_HIP_DEVICE_LIBS to "
                               "the folder holding ocml.bc")
        out += ["-Xclang", "-mlink-builtin-bitcode", "-Xclang", ocml]
    return out + list(options.get("tilecore.extra_flags", ()))


class HIPCompiler(Compiler):
    """clang for one AMDGPU architecture (``gfx90a``, ``gfx942``, ...); ``compile`` returns the code object."""

    def __init__(self, arch: str = "gfx942"):
        self.arch = arch

    def version(self) -> str:
        return clang_version()

    def compile(self, source: Source, options: dict) -> bytes:
        clang = find_clang()
        if clang is None:
            raise CompileError(f"no clang with the AMDGPU target found: {INSTALL_HINT}")
        arch = source.meta.get("arch") or self.arch
        tmp = Path(tempfile.mkdtemp(prefix="tilecore-hip-build-"))
        src, out = tmp / "kernel.hip", tmp / "kernel.hsaco"
        src.write_text(source.code)
        cmd = [clang, *_flags(arch, options, source.meta.get("libs", ())), str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            # the source stays on disk so the user can read the line clang names
            raise CompileError(f"clang rejected the generated HIP code for {arch} (source: {src}):\n"
                               f"{proc.stderr.strip()[-4000:]}\nThis is a tilecore bug; please report it with "
                               "that file")
        binary = out.read_bytes()
        shutil.rmtree(tmp, ignore_errors=True)
        return binary


def disassemble(binary: bytes, arch: str) -> str:
    """``llvm-objdump -d --mcpu=<arch>`` of a code object."""
    tool = find_objdump()
    if tool is None:
        raise SystemExit(f"tilecore compile --emit asm: llvm-objdump not found ({INSTALL_HINT})")
    with tempfile.TemporaryDirectory(prefix="tilecore-hip-asm-") as tmp:
        path = Path(tmp) / "kernel.hsaco"
        path.write_bytes(binary)
        proc = subprocess.run([tool, "-d", f"--mcpu={arch}", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"llvm-objdump failed: {proc.stderr.strip()}")
        return proc.stdout
