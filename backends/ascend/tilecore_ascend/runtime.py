"""Run generated AscendC: on the emulator here (g++ + ctypes, mode ``emulated``); CANN where it exists.

The emulated build compiles the kernel source with ``-DTC_ASCEND_EMU`` against ``emulator/ascendc_emu.h`` (no
CANN header), with the target's buffer capacities from ``Source.meta["limits"]``. ``launch`` runs every block
through the generated ``tc_launch`` and raises :class:`~tilecore.errors.KernelRuntimeError` listing the
checker's findings (races between pipes, capacity, alignment, unbalanced flags) if there are any: a kernel
with a finding never returns results as if it had passed.

Device mode (bisheng/ccec + ACL on torch_npu tensors) is not written yet: ``mode()`` never claims it.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tilecore.errors import CompileError, KernelRuntimeError
from tilecore.plugin import Program, Runtime, Source

from .codegen import emulator_dir, prelude_dir


@functools.lru_cache(maxsize=1)
def find_cxx() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or cxx
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


@functools.lru_cache(maxsize=1)
def cxx_version() -> str:
    cxx = find_cxx()
    if cxx is None:
        return ""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0].strip() if out else ""


def emulator_flags(source: Source, options: dict) -> list:
    limits = source.meta.get("limits", {})
    out = ["-std=c++17", "-O1", "-fPIC", "-shared", "-w", "-DTC_ASCEND_EMU", f"-I{emulator_dir()}", f"-I{prelude_dir()}"]
    if "max_ub_bytes" in limits:
        out.append(f"-DTC_EMU_UB_BYTES={limits['max_ub_bytes']}")
    if "max_l1_bytes" in limits:
        out.append(f"-DTC_EMU_L1_BYTES={limits['max_l1_bytes']}")
    if "event_ids_per_hard_event" in limits:
        out.append(f"-DTC_EMU_EVENT_IDS={limits['event_ids_per_hard_event']}")
    if options.get("tilecore.debug"):
        out.append("-g")
    return out + list(options.get("tilecore.extra_flags", ()))


def _workdir() -> Path:
    d = Path(tempfile.gettempdir()) / f"tilecore-ascend-{os.getuid() if hasattr(os, 'getuid') else 'u'}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def compile_emulated(code: str, source: Source, options: dict) -> bytes:
    cxx = find_cxx()
    if cxx is None:
        raise CompileError("no C++ compiler for the Ascend emulator: install g++ or set $CXX")
    with tempfile.TemporaryDirectory(prefix="tilecore-ascend-build-") as tmp:
        src, out = Path(tmp) / "kernel.cpp", Path(tmp) / "kernel.so"
        src.write_text(code)
        cmd = [cxx, *emulator_flags(source, options), str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"g++ rejected the generated AscendC under the emulator:\n{proc.stderr.strip()[-4000:]}\n"
                               "This is a tilecore-ascend bug; please report it with kernel.get_kernel_source()")
        return out.read_bytes()


class AscendEmulatedRuntime(Runtime):
    tensor_device = "cpu"

    def mode(self) -> str:
        return "emulated"

    def build(self, source: Source, options: dict) -> bytes:
        return compile_emulated(source.code, source, options)

    def load(self, binary: bytes, source: Source) -> "EmulatedProgram":
        path = _workdir() / f"{hashlib.sha256(binary).hexdigest()[:32]}.so"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so.tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(binary)
            os.replace(tmp, path)
        return EmulatedProgram(path, source)


class EmulatedProgram(Program):
    def __init__(self, path: Path, source: Source):
        self.lib = ctypes.CDLL(str(path))
        self.fn = getattr(self.lib, source.meta.get("launcher", "tc_launch"))
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                            ctypes.POINTER(ctypes.c_double)]
        self.log = self.lib.tc_emu_log
        self.log.restype = ctypes.c_char_p
        #: the emulator's timing of the last launch: ``(makespan, work)`` in rough cycles, the per-core
        #: makespans added up and the sum of every instruction's cost (work / makespan: how much the pipes overlap)
        self.cycles = (0.0, 0.0)

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        bufs = (ctypes.c_void_p * max(1, len(buffers)))(*buffers)
        iv = (ctypes.c_int64 * max(1, len(ints)))(*ints)
        fv = (ctypes.c_double * max(1, len(floats)))(*floats)
        findings = self.fn(bufs, iv, fv)
        out = (ctypes.c_double * 2)()
        self.lib.tc_emu_cycles(out)
        self.cycles = (out[0], out[1])
        if findings:
            raise KernelRuntimeError(f"Ascend emulator: {findings} finding(s); the kernel is wrong on hardware "
                                     f"even where its results look right:\n{self.log().decode(errors='replace')}")
