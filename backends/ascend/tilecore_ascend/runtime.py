"""Run generated AscendC: on the emulator here (g++ + ctypes, mode ``emulated``); on an NPU where CANN exists.

The emulated build compiles the kernel source with ``-DTC_ASCEND_EMU`` against ``emulator/ascendc_emu.h`` (no
CANN header), with the target's buffer capacities from ``Source.meta["limits"]``. ``launch`` runs every block
through the generated ``tc_launch`` and raises :class:`~tilecore.errors.KernelRuntimeError` listing the
checker's findings (races between pipes, capacity, alignment, unbalanced flags) if there are any: a kernel
with a finding never returns results as if it had passed.

The device build (:class:`AscendDeviceRuntime`, mode ``device``) is used only where :func:`device_status`
finds all of it: a CANN toolkit (``$ASCEND_HOME_PATH``, ``$ASCEND_TOOLKIT_HOME`` or
``/usr/local/Ascend/ascend-toolkit/latest``) with ``bisheng``, an importable ``torch_npu`` and an NPU it sees.
It compiles the same source with ``bisheng -xasc --npu-arch=dav-2201`` into a shared library whose
``tc_call`` launches ``tc_kernel<<<blocks, nullptr, stream>>>`` on torch_npu's current stream (the
workspace of a mixed kernel is a torch_npu tensor). Everything it needs is imported when it runs, so this
module imports without CANN; ``TILECORE_ASCEND_EMULATE=1`` keeps the emulator on an NPU machine.
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
    # -fno-gnu-unique: the emulator's state (function-local statics of inline functions) would otherwise be
    # STB_GNU_UNIQUE, one copy for every kernel library loaded into the process, so one kernel's record of
    # core-to-core writes showed up in another's emulation (a flaky finding under pytest-xdist)
    out = ["-std=c++17", "-O1", "-fPIC", "-shared", "-w", "-fno-gnu-unique", "-DTC_ASCEND_EMU", f"-I{emulator_dir()}",
           f"-I{prelude_dir()}"]
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


# -- the device runtime (CANN: bisheng + ACL through torch_npu) -----------------------------------------------

#: ``--npu-arch`` of each target (the AI Core of Atlas A2 and A3: dav-c220 cube/vector, "dav-2201" to bisheng)
NPU_ARCH = {"910b": "dav-2201", "a3": "dav-2201"}


def cann_home() -> Path | None:
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        v = os.environ.get(var)
        if v and Path(v).is_dir():
            return Path(v)
    default = Path("/usr/local/Ascend/ascend-toolkit/latest")
    return default if default.is_dir() else None


def find_bisheng(home: Path | None) -> str | None:
    if home is not None:
        for rel in ("bin/bisheng", "compiler/ccec_compiler/bin/bisheng", "tools/bisheng_compiler/bin/bisheng"):
            if (home / rel).is_file():
                return str(home / rel)
    return shutil.which("bisheng")


def device_status() -> tuple:
    """``(True, "")`` where kernels can run on an NPU here, else ``(False, why not)``."""
    if os.environ.get("TILECORE_ASCEND_EMULATE"):
        return False, "TILECORE_ASCEND_EMULATE is set"
    home = cann_home()
    if home is None:
        return False, ("no CANN toolkit ($ASCEND_HOME_PATH and $ASCEND_TOOLKIT_HOME unset, "
                       "/usr/local/Ascend/ascend-toolkit/latest absent)")
    if find_bisheng(home) is None:
        return False, f"the CANN toolkit at {home} has no bisheng compiler"
    try:
        import torch
        import torch_npu  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means no device path
        return False, f"torch_npu is not importable ({type(e).__name__}: {e})"
    try:
        n = torch.npu.device_count() if torch.npu.is_available() else 0
    except Exception as e:  # noqa: BLE001
        return False, f"torch_npu cannot query the NPUs ({e})"
    if not n:
        return False, "torch_npu sees no NPU"
    return True, ""


class AscendDeviceRuntime(Runtime):
    """Mode ``device``: the generated AscendC built by bisheng, launched through ACL on torch_npu tensors."""

    tensor_device = "npu"

    def __init__(self, arch: str = "910b"):
        self.arch = arch

    def mode(self) -> str:
        return "device"

    def build(self, source: Source, options: dict) -> bytes:
        home = cann_home()
        bisheng = find_bisheng(home)
        if home is None or bisheng is None:
            raise CompileError("tilecore-ascend cannot build for the NPU here: " + device_status()[1] +
                               ". Install CANN and set ASCEND_HOME_PATH, or run on the emulator (the default "
                               "where CANN is missing)")
        with tempfile.TemporaryDirectory(prefix="tilecore-ascend-npu-") as tmp:
            src, out = Path(tmp) / "kernel.cpp", Path(tmp) / "kernel.so"
            src.write_text(source.code)
            cmd = [bisheng, f"--npu-arch={NPU_ARCH.get(self.arch, 'dav-2201')}", "-O2", "-std=c++17", "-xasc",
                   "-fPIC", "--shared", f"-I{home}/include", f"-I{prelude_dir()}", str(src), "-o", str(out),
                   f"-L{home}/lib64", "-lruntime", "-lascendcl", *options.get("tilecore.extra_flags", ())]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                raise CompileError(f"bisheng rejected the generated AscendC:\n{(proc.stderr or proc.stdout).strip()[-4000:]}\n"
                                   "This is a tilecore-ascend bug; please report it with kernel.get_kernel_source()")
            return out.read_bytes()

    def load(self, binary: bytes, source: Source) -> "DeviceProgram":
        path = _workdir() / f"npu-{hashlib.sha256(binary).hexdigest()[:32]}.so"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so.tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(binary)
            os.replace(tmp, path)
        return DeviceProgram(path, source)

    def timer(self):
        import time

        import torch

        def now():
            torch.npu.synchronize()
            return time.perf_counter()

        return now


class DeviceProgram(Program):
    def __init__(self, path: Path, source: Source):
        self.lib = ctypes.CDLL(str(path))
        self.call = self.lib.tc_call
        self.call.restype = ctypes.c_int
        self.call.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                              ctypes.POINTER(ctypes.c_double), ctypes.c_void_p]
        self.blocks = self.lib.tc_blocks
        self.blocks.restype = ctypes.c_int64
        self.blocks.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double)]
        self.ws_bytes = int(source.meta.get("workspace_bytes_per_block", 0) or 0)

    def launch(self, buffers: list, ints: list, floats: list) -> None:
        import torch

        bufs = (ctypes.c_void_p * max(1, len(buffers)))(*buffers)
        iv = (ctypes.c_int64 * max(1, len(ints)))(*ints)
        fv = (ctypes.c_double * max(1, len(floats)))(*floats)
        ws = None
        if self.ws_bytes:  # the cube -> vector hand-off, one slice per block, alive until the kernel ran
            ws = torch.empty(int(self.blocks(iv, fv)) * self.ws_bytes, dtype=torch.uint8, device="npu")
        stream = torch.npu.current_stream().npu_stream
        rc = self.call(ctypes.c_void_p(stream), bufs, iv, fv, ctypes.c_void_p(ws.data_ptr() if ws is not None else 0))
        if rc != 0:
            raise KernelRuntimeError(f"the Ascend kernel launch failed (ACL error {rc})")
        if ws is not None:
            torch.npu.synchronize()

    def synchronize(self) -> None:
        import torch

        torch.npu.synchronize()
