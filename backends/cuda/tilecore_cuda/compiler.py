"""Build CUDA C++ to a cubin: NVRTC (``nvidia-cuda-nvrtc`` + ``cuda-bindings``), else ``nvcc`` on PATH
(or ``$TILECORE_NVCC``); ``tilecore.cuda.compiler`` = ``nvrtc`` or ``nvcc`` forces one. The source is
self-contained (the codegen inlines the preludes), so only the CUDA headers (``cuda_fp16.h`` ...) are
looked up, in the include directories below. Nothing here needs a GPU.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tilecore.errors import CompileError
from tilecore.plugin import Compiler, Source

CUDA_INCLUDE_DIRS = ("/usr/local/cuda/include",)

# -- toolchains ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _nvrtc():
    from .runtime import _import_torch_first

    _import_torch_first()
    try:
        from cuda.bindings import nvrtc  # type: ignore
    except Exception:  # noqa: BLE001 - any import problem means no NVRTC
        try:
            from cuda import nvrtc  # type: ignore  (cuda-python < 12.6 layout)
        except Exception:  # noqa: BLE001
            return None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
        if int(err) != 0:
            return None
    except Exception:  # noqa: BLE001 - the wheel is there but libnvrtc is not
        return None
    return nvrtc


@functools.lru_cache(maxsize=1)
def _include_dirs_cached() -> tuple:
    return tuple(_include_dirs_uncached())


def _include_dirs() -> list:
    return list(_include_dirs_cached())


@functools.lru_cache(maxsize=1)
def find_nvcc() -> str | None:
    env = os.environ.get("TILECORE_NVCC")
    if env:
        return shutil.which(env) or env
    for cand in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    mod = _nvrtc()
    if mod is None:
        return ""
    _, major, minor = mod.nvrtcVersion()
    return f"nvrtc {major}.{minor}"


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        return ""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return "nvcc " + (lines[0].split("release", 1)[1].strip() if lines else "unknown")


def nvrtc_usable() -> bool:
    """NVRTC is there and so are the CUDA headers the generated code includes (cuda_fp16.h...)."""
    return _nvrtc() is not None and any(Path(d, "cuda_fp16.h").exists() for d in _include_dirs())


def toolchain() -> str:
    """Which compiler builds kernels here, with its version ('' when none)."""
    return (nvrtc_version() if nvrtc_usable() else "") or nvcc_version()


def _include_dirs_uncached() -> list:
    dirs = [d for d in CUDA_INCLUDE_DIRS if os.path.isdir(d)]
    nvcc = find_nvcc()
    if nvcc:
        inc = Path(nvcc).resolve().parent.parent / "include"
        if inc.is_dir() and str(inc) not in dirs:
            dirs.append(str(inc))
    try:  # headers shipped in wheels (nvidia-cuda-runtime and friends)
        import nvidia  # type: ignore

        for root in getattr(nvidia, "__path__", []):
            for inc in sorted(Path(root).glob("*/include")):
                if (inc / "cuda_fp16.h").exists():
                    dirs.append(str(inc))
    except ImportError:
        pass
    return dirs


def _flags(options: dict) -> list:
    out = ["-std=c++17", "-lineinfo"] if options.get("tilecore.debug") else ["-std=c++17"]
    out += ["--ptxas-options=-v"]  # registers, spills and performance remarks for ptxas_report (costs no time)
    if options.get("tilecore.fast_math"):
        out += ["--use_fast_math"]
    else:
        out += ["--fmad=false"]
    return out + list(options.get("tilecore.extra_flags", ()))


_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
_LOSS = re.compile(r"Potential Performance Loss: (.*)")


def ptxas_report(log: str) -> dict:
    """What ptxas said (``--ptxas-options=-v``) that a kernel author should see: ``registers`` per thread, the
    ``stack``, ``spill_stores`` and ``spill_loads`` bytes per thread, and its ``performance_loss`` remarks (e.g.
    wgmma serialized for want of registers). Absent numbers are left out; a log without ptxas's lines at all gives
    ``{"reported": False}``, so that "no remark" and "no report" differ: on the H100 / H200 device hosts NVRTC 13.0
    returned its ptxas lines only for the first compile of a program in a whole run, in any process (a probe, tenth
    session: the same kernel compiled 4 times under plain pytest, then 4 times under pytest-xdist, with tilecore's
    own cache off: only the very first log had them; on the CPU machines every compile has them; cause not found)."""
    out: dict = {}
    if m := _SPILLS.search(log):
        out["stack"], out["spill_stores"], out["spill_loads"] = (int(x) for x in m.groups())
    if m := _REGISTERS.search(log):
        out["registers"] = int(m.group(1))
    losses = sorted({m.group(1).strip().rstrip(".") for m in _LOSS.finditer(log)})
    if losses:
        out["performance_loss"] = losses
    if not out:
        out["reported"] = False
    return out


def performance_notes(report: dict) -> list:
    """The notes a :class:`tilecore.errors.PerformanceWarning` carries for a ptxas report, each with the fix."""
    notes = []
    if report.get("spill_stores") or report.get("spill_loads"):
        notes.append(f"ptxas spilled registers to local memory ({report.get('spill_stores', 0)} bytes stored, "
                     f"{report.get('spill_loads', 0)} loaded per thread at {report.get('registers', '?')} registers): "
                     "use smaller tiles (block_N / block_M) or fewer threads per block")
    for loss in report.get("performance_loss", ()):
        if "insufficient register" in loss:
            fix = "too many accumulator registers per thread: use smaller tiles, or fewer warpgroups per block"
        else:  # e.g. "non wgmma instructions defining accumulator registers": the generated code's doing
            fix = "the generated code's doing, not the kernel's: please report it with kernel.get_kernel_source()"
        notes.append(f"ptxas: {loss} ({fix})")
    return notes


#: registers are allocated per warp in units of 256 (8 per thread), a multiprocessor has 64K of them (sm_80-sm_100);
#: the emitter's setmaxnreg budget (codegen.CUDAEmitter.REGISTER_FILE) is the same file
REGISTER_UNIT, REGISTERS_PER_SM = 8, 65536


def persistent_notes(report: dict, meta: dict) -> list:
    """A note where a persistent launch (``tilecore.persistent=True``, D36) assumed more blocks per multiprocessor
    than ptxas's register count allows: the blocks past the resident ones would start only when others finish all
    their tiles."""
    p = meta.get("persistent") or {}
    regs, threads = report.get("registers"), meta.get("threads")
    if not p.get("per_unit") or not regs or not threads:
        return []
    per_thread = -(-int(regs) // REGISTER_UNIT) * REGISTER_UNIT
    fits = REGISTERS_PER_SM // (per_thread * int(threads))
    if fits >= p["per_unit"]:
        return []
    resident = max(fits, 1) * p["units"]
    return [f"the persistent launch (tilecore.persistent=True) assumed {p['per_unit']} blocks per multiprocessor, "
            f"but at ptxas's {regs} registers per thread {fits} fit: pass tilecore.persistent={resident} "
            f"(the resident blocks), or tilecore.persistent=False"]


def _check(mod, res, what: str, prog=None) -> None:
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise CompileError(f"NVRTC {what} failed: {mod.nvrtcGetErrorString(err)[1]!r}")


#: NVRTC-only flags: ``--minimal`` leaves out texture and surface functions, device-runtime calls and launches,
#: and the runtime API's types, none of which generated code uses (about 8 ms of the front end; D25)
NVRTC_FLAGS = ("--minimal",)


def build_nvrtc(code: str, arch: str, options: dict, report: dict | None = None) -> bytes:
    """The cubin of ``code`` for ``arch``; ``report``, when given, receives :func:`ptxas_report` of the log."""
    nvrtc = _nvrtc()
    res = nvrtc.nvrtcCreateProgram(code.encode(), b"tilecore_kernel.cu", 0, [], [])
    _check(nvrtc, res, "create")
    prog = res[1]
    opts = [f"--gpu-architecture={arch}".encode()] + [f.encode() for f in (*NVRTC_FLAGS, *_flags(options))]
    opts += [f"-I{d}".encode() for d in _include_dirs()]
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        if report is not None:
            report.update(ptxas_report(log.decode(errors="replace")))
        if int(err) != 0:
            raise CompileError("NVRTC rejected the generated code:\n" + log.decode(errors="replace").strip()[-4000:]
                               + "\nThis is a tilecore bug; please report it with the source from "
                               "kernel.get_kernel_source()")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "get cubin")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def build_nvcc(code: str, arch: str, options: dict, report: dict | None = None) -> bytes:
    nvcc = find_nvcc()
    num = arch[3:]  # sm_90a -> 90a
    with tempfile.TemporaryDirectory(prefix="tilecore-cuda-build-") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(code)
        cmd = [nvcc, "--cubin", f"-gencode=arch=compute_{num},code={arch}", *_flags(options), str(src),
               "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"nvcc rejected the generated code:\n{proc.stderr.strip()[-4000:]}\n"
                               "This is a tilecore bug; please report it with the source from "
                               "kernel.get_kernel_source()")
        if report is not None:
            report.update(ptxas_report(proc.stdout + proc.stderr))
        return out.read_bytes()


class CUDACompiler(Compiler):
    """NVRTC or nvcc for one architecture (``sm_80``, ``sm_90a``, ...)."""

    def __init__(self, arch: str = "sm_90a"):
        self.arch = arch

    def version(self) -> str:
        return toolchain()

    def compile(self, source: Source, options: dict) -> bytes:
        which = options.get("tilecore.cuda.compiler")
        if which not in (None, "nvrtc", "nvcc"):
            raise CompileError(f"tilecore.cuda.compiler must be 'nvrtc' or 'nvcc', got {which!r}")
        report: dict = {}
        if which != "nvcc" and (nvrtc_usable() or which == "nvrtc" and _nvrtc() is not None):
            binary = build_nvrtc(source.code, self.arch, options, report)
        elif which != "nvrtc" and find_nvcc() is not None:
            binary = build_nvcc(source.code, self.arch, options, report)
        else:
            binary = None
        if binary is not None:
            # kept with the kernel (kernel.meta["source"]["meta"]); the core warns with the notes (plugin API 1.7)
            source.meta["ptxas"] = report
            notes = performance_notes(report) + persistent_notes(report, source.meta)
            if notes:
                source.meta["performance_notes"] = notes
            return binary
        raise CompileError("no CUDA compiler found: install NVRTC (pip install 'nvidia-cuda-nvrtc==13.0.*' "
                           "'nvidia-cuda-runtime==13.0.*' 'cuda-bindings==13.0.*') or put nvcc on PATH")
