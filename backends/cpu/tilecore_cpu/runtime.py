"""Compile C with the system compiler (OpenMP), load it with ctypes, launch on host memory."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from tilecore.errors import MAX_FAULT_VALUES, CompileError
from tilecore.plugin import Program, Runtime, Source
from tilecore.runtime.launch import AssertionTable


@functools.lru_cache(maxsize=1)
def find_compiler() -> str | None:
    """``$CC`` if set, else the first of cc, gcc, clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    cc = find_compiler()
    if cc is None:
        return ""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0].strip() if out else ""


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def flags(options: dict) -> list:
    out = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp", "-w"]
    if options.get("tilecore.fast_math"):
        out += ["-ffp-contract=fast", "-fno-math-errno"]
    else:
        out += ["-ffp-contract=off"]
    if not options.get("tilecore.cpu.portable"):
        out.append("-march=native")
    if options.get("tilecore.debug"):
        out.append("-g")
    out += list(options.get("tilecore.extra_flags", ()))
    return out


def _workdir() -> Path:
    d = Path(tempfile.gettempdir()) / f"tilecore-cpu-{os.getuid() if hasattr(os, 'getuid') else 'u'}"
    d.mkdir(parents=True, exist_ok=True)
    return d


class CPURuntime(Runtime):
    tensor_device = "cpu"

    def build(self, source: Source, options: dict) -> bytes:
        cc = find_compiler()
        if cc is None:
            raise CompileError("no C compiler found: install gcc (apt-get install gcc) or set $CC")
        with tempfile.TemporaryDirectory(prefix="tilecore-cpu-build-") as tmp:
            src = Path(tmp) / "kernel.c"
            out = Path(tmp) / "kernel.so"
            src.write_text(source.code)
            cmd = [cc, *flags(options), str(src), "-o", str(out), "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(f"the C compiler rejected the generated code ({' '.join(cmd[:1])}):\n"
                                   f"{proc.stderr.strip()[-4000:]}\nThis is a tilecore bug; please report it "
                                   "with the source from kernel.get_kernel_source()")
            return out.read_bytes()

    def load(self, binary: bytes, source: Source) -> "CPUProgram":
        digest = hashlib.sha256(binary).hexdigest()[:32]
        path = _workdir() / f"{digest}.so"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so.tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(binary)
            os.replace(tmp, path)
        return CPUProgram(path, source)


class CPUProgram(Program):
    def __init__(self, path: Path, source: Source):
        self.lib = ctypes.CDLL(str(path))
        self.fn = getattr(self.lib, source.entry)
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                            ctypes.POINTER(ctypes.c_double)]
        self.asserts = AssertionTable(source.meta)

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        bufs = (ctypes.c_void_p * max(1, len(buffers)))(*buffers)
        iv = (ctypes.c_int64 * max(1, len(ints)))(*ints)
        fv = (ctypes.c_double * max(1, len(floats)))(*floats)
        status = self.fn(bufs, iv, fv)
        if status:
            values = []
            if self.asserts.records_values(status):  # a checked-mode bounds check: its indices are in the module
                values = list((ctypes.c_int64 * MAX_FAULT_VALUES).in_dll(self.lib, "tc_fault_values"))
            raise self.asserts.failure(status, values)
