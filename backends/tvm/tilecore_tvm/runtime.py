"""The compiling process's side of the TVM worker, and the runtime the backend reports.

One worker (``python -m tilecore_tvm.worker``) per compiling process, started on the first compile and
kept for the next ones (importing apache-tvm costs about a second; a conformance run compiles hundreds
of kernels through one worker). A worker that dies (an LLVM abort inside TVM) fails that compile with a
CompileError that says so, and the next compile starts a fresh one.

Modes: ``compile-only`` for ``tvm:rocm:<gfx>`` (TVM's LLVM produced and ld.lld linked an AMDGPU code
object), ``codegen-only`` for ``tvm:metal``, ``tvm:opencl`` and ``tvm:webgpu`` (TVM produced the source;
no compiler of that language runs it here). Nothing launches: ``load`` raises DeviceError.
"""
from __future__ import annotations

import atexit
import base64
import hashlib
import json
import os
import subprocess
import sys
import threading

from tilecore.errors import CompileError, DeviceError
from tilecore.plugin import Runtime, Source

_lock = threading.Lock()
_worker: list = []          # [Popen] of this process's worker
_binaries: dict = {}        # sha256 of the emitted source -> code object bytes (rocm)
#: the worker's environment: TVM's device-backend auto-loading costs import time and is not needed
WORKER_ENV = {"TVM_DEVICE_BACKEND_AUTOLOAD": "0"}
STARTS = [0]                # how many workers this process started (tests read it)


def _start():
    env = {**os.environ, **WORKER_ENV}
    p = subprocess.Popen([sys.executable, "-m", "tilecore_tvm.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, bufsize=1)
    hello = p.stdout.readline()
    if not hello:
        err = p.stderr.read()[-3000:]
        raise CompileError("the TVM worker (python -m tilecore_tvm.worker) did not start: "
                           + (err.strip() or "no output") + ". Is apache-tvm installed? "
                           "(pip install tilecore-tvm installs apache-tvm==0.27.0.post1)")
    STARTS[0] += 1
    # drain stderr (TVM's warnings) so the pipe never fills and blocks the worker
    threading.Thread(target=_drain, args=(p,), daemon=True).start()
    return p


def _drain(p) -> None:
    tail: list = []
    for line in p.stderr:
        tail.append(line)
        del tail[:-40]
    p.stderr_tail = "".join(tail)


def request(req: dict) -> dict:
    """Send one request to this process's worker; the reply, or CompileError when the worker died."""
    with _lock:
        if not _worker or _worker[0].poll() is not None:
            _worker[:] = [_start()]
        p = _worker[0]
        try:
            p.stdin.write(json.dumps(req) + "\n")
            p.stdin.flush()
            line = p.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            p.wait()
            _worker.clear()
            tail = "".join(x for x in getattr(p, "stderr_tail", "").splitlines(True) if "Warning:" not in x)
            raise CompileError(f"TVM aborted while compiling (exit status {p.returncode}; LLVM errors in apache-tvm "
                               f"end the process). Its last output:\n{tail[-2000:]}")
        return json.loads(line)


def compile_program(program: dict, tvm_target: dict, want_tir: bool = False, **options) -> dict:
    """TVM's output for a bridged program; ``options`` reach the worker's request (tests use ``pipeline``)."""
    reply = request({"program": program, "target": tvm_target, "want_tir": want_tir, **options})
    if not reply.get("ok"):
        raise CompileError(f"TVM rejected the bridged kernel {program.get('name')} for {tvm_target}: "
                           f"{reply.get('error', '?')}")
    return reply


def remember_binary(source_code: str, binary_b64: str | None) -> None:
    if binary_b64:
        _binaries[hashlib.sha256(source_code.encode()).hexdigest()] = base64.b64decode(binary_b64)


@atexit.register
def shutdown() -> None:
    """Stop this process's worker (tests use it; a process's worker otherwise ends with it)."""
    with _lock:
        for p in _worker:
            try:
                p.stdin.close()
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001
                p.kill()
        _worker.clear()


class TVMRuntime(Runtime):
    tensor_device = "cpu"

    def __init__(self, target_kind: str):
        self.kind = target_kind  # "metal", "opencl", "webgpu" or "rocm"

    def build(self, source: Source, options: dict) -> bytes:
        if self.kind != "rocm":
            return source.code.encode()  # codegen-only: the checked source is the artifact
        key = hashlib.sha256(source.code.encode()).hexdigest()
        if key not in _binaries:  # emitted in another process (a cache entry without its binary): rebuild
            reply = compile_program(source.meta["program"], source.meta["tvm_target"])
            remember_binary(reply["source"], reply["binary"])
            _binaries.setdefault(key, base64.b64decode(reply["binary"]))
        return _binaries[key]

    def load(self, binary: bytes, source: Source):
        raise DeviceError(f"tilecore-tvm compiles only: this kernel for {source.meta.get('target', self.kind)} was "
                          f"produced by TVM's {self.kind} code generator ({self.mode()}); run it with a backend "
                          "that has a runtime for the device")

    def mode(self) -> str:
        return "compile-only" if self.kind == "rocm" else "codegen-only"

    def timer(self):
        import time

        return time.perf_counter
