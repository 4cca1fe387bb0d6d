"""tilecore-tvm: apache-tvm's code generators as a tilecore backend.

The core's pipeline lowers the kernel as for any SIMT backend (``tilecore.simt_distribute``: parallel
nests strided over the block's threads, explicit barriers); ``bridge.py`` writes the lowered IR as a
plain-data program, refusing at the user's line what it cannot express; a worker process
(``worker.py``, the only module that imports ``tvm``) rebuilds it as TVM TIR (``tvm.tirx``) and runs
``tvm.compile`` with a pipeline of our own.

Targets: ``tvm:metal`` (MSL), ``tvm:opencl`` (OpenCL C), ``tvm:webgpu`` (WGSL): mode ``codegen-only``;
``tvm:rocm:<gfx>`` for gfx90a, gfx942, gfx950, gfx1100 (``tvm:rocm`` is gfx942): an AMDGPU code object
from TVM's LLVM, linked with ld.lld, mode ``compile-only``. Each target has its own capability profile
(``tvm/metal``, ``tvm/opencl``, ``tvm/webgpu``, ``tvm/rocm-<gfx>``).

``import tilecore_tvm`` (and so ``tilecore targets list``) never imports ``tvm``: the probe asks
``importlib.util.find_spec`` and the package metadata.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util

from tilecore.plugin import Backend, PassSpec, Probe, Target, hookimpl

__version__ = "0.1.0"

SOURCE_KINDS = ("metal", "opencl", "webgpu")
ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100")
DEFAULT_ROCM_ARCH = "gfx942"
#: the apache-tvm release this backend is written and tested against (pinned in pyproject.toml)
TVM_VERSION = "0.27.0.post1"
INSTALL_HINT = f"pip install apache-tvm=={TVM_VERSION} apache-tvm-ffi (or pip install tilecore-tvm)"


def tvm_version() -> str:
    """The installed apache-tvm's version from its metadata ('' when absent); imports nothing."""
    if importlib.util.find_spec("tvm") is None:
        return ""
    try:
        return importlib.metadata.version("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class TVMBackend(Backend):
    name = "tvm"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-tvm"

    def parse_target(self, spec: str):
        text = spec.strip().lower()
        if not text.startswith("tvm:"):
            return None
        rest = text[4:]
        if rest in SOURCE_KINDS:
            return Target(backend=self.name, kind="tvm", arch=rest, capability_id=f"tvm/{rest}")
        if rest == "rocm":
            rest = f"rocm:{DEFAULT_ROCM_ARCH}"
        if rest.startswith("rocm:") and rest[5:] in ROCM_ARCHS:
            return Target(backend=self.name, kind="tvm", arch=rest, capability_id=f"tvm/rocm-{rest[5:]}")
        return None

    def targets(self) -> list:
        return [f"tvm:{k}" for k in SOURCE_KINDS] + [f"tvm:rocm:{a}" for a in ROCM_ARCHS]

    def probe(self) -> Probe:
        v = tvm_version()
        if not v:
            return Probe("no-toolchain", detail=f"apache-tvm is not installed: {INSTALL_HINT}")
        return Probe("no-device", toolchain=f"apache-tvm {v}",
                     detail=f"apache-tvm {v}: kernels are compiled (rocm: code objects, compile-only) or generated "
                            "(metal, opencl, webgpu: source, codegen-only); nothing runs here")

    def passes(self, target) -> list:
        from tilecore.passes.simt import simt_distribute  # compile-time only

        return [PassSpec("before-codegen", simt_distribute, position="before")]

    def emitter(self, target):
        from .codegen import TVMEmitter

        return TVMEmitter()

    def runtime(self, target):
        from .runtime import TVMRuntime

        return TVMRuntime((target.arch or "").split(":")[0])

    def toolchain_version(self, target) -> str:
        return f"apache-tvm {tvm_version()}"


@hookimpl
def tilecore_backends():
    return [TVMBackend()]
