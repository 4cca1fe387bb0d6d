"""tilecore-cpu: the host CPU backend, the reference every other backend is compared against.

C from the core's C-family emitter, compiled by the system C compiler with OpenMP across blocks,
loaded with ctypes, run on numpy arrays and CPU torch tensors.
"""
from __future__ import annotations

import os

from tilecore.plugin import Backend, DeviceInfo, Probe, Target, hookimpl

from .codegen import CPUEmitter
from .runtime import CPURuntime, compiler_version, cpu_model, find_compiler

__version__ = "0.1.0"


class CPUBackend(Backend):
    name = "cpu"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-cpu"

    def parse_target(self, spec: str):
        text = spec.strip().lower()
        if text in ("cpu", "cpu:host", "host", "c"):
            return Target(backend=self.name, kind="cpu", arch="", capability_id="cpu/host")
        return None

    def targets(self) -> list:
        return ["cpu"]

    def probe(self) -> Probe:
        cc = find_compiler()
        if cc is None:
            return Probe("no-toolchain", detail="no C compiler (install gcc or set $CC)")
        cores = os.cpu_count() or 1
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            mem = 0
        caps = {"execution": {"cores": cores}}
        if mem:
            caps["memory"] = {"global": {"bytes": mem}}
        dev = DeviceInfo(cpu_model(), 0, {"cores": cores, "memory_bytes": mem})
        return Probe("ok", (dev,), caps, toolchain=compiler_version())

    def intrinsics(self, target) -> list:
        from .intrinsics import TABLE  # compile-time only: loading a kernel must not pull in the passes

        return list(TABLE)

    def emitter(self, target):
        return CPUEmitter()

    def runtime(self, target):
        return CPURuntime()

    def toolchain_version(self, target) -> str:
        return f"{compiler_version()} | {cpu_model()}"


@hookimpl
def tilecore_backends():
    return [CPUBackend()]
