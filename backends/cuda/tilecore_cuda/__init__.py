"""tilecore-cuda: NVIDIA GPUs through CUDA C++.

Tile ops lower through the intrinsic table (``intrinsics.py``): ``mma.sync`` tensor-core GEMMs (with
``ldmatrix``) and ``cp.async`` copies as block-wide operations of the prelude, a thread-per-element GEMM
otherwise, the core's generic lowering for the rest. Whole-kernel passes in the ``tile-lowering`` slot put the
forms they recognise in registers and pipeline them (``regprog.py``: mma.sync / WGMMA register programs
with cp.async stages; ``hopper.py``: TMA + mbarrier + WGMMA pipelines, warp-specialized). Everything
else is distributed over the block's threads by the core's ``tilecore.simt_distribute`` pass, with
fragments in shared memory. CUDA C++ comes from the core's SIMT C++ emitter (``codegen.py``), cubins
from NVRTC or nvcc, launches go through the driver API on torch's current stream. Without a GPU the
backend compiles (``compile-only`` mode); without a compiler it reports ``no-toolchain``.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tilecore.plugin import Backend, DeviceInfo, PassSpec, Probe, Target, hookimpl

from .codegen import CUDAEmitter
from .runtime import CUDARuntime, arch_of, device_count, device_properties, toolchain

__version__ = "0.1.0"

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a")
ALIASES = {"sm_90": "sm_90a", "sm_100": "sm_100a", "ampere": "sm_80", "hopper": "sm_90a"}
DEFAULT_ARCH = "sm_90a"


@functools.lru_cache(maxsize=1)
def local_arch() -> str:
    """The first GPU's architecture, or sm_90a when there is none (or it is newer than we know)."""
    if device_count() == 0:
        return DEFAULT_ARCH
    arch = arch_of(device_properties(0))
    return arch if arch in ARCHS else DEFAULT_ARCH


def lowering_path(kernel) -> str:
    """Which path a kernel compiled for a CUDA target took: ``"register program (mma.sync)"``, ``"hopper pipeline"``
    (a GEMM loop on TMA + WGMMA) or ``"generic"`` (the core's lowering, distributed over the threads; on sm_90a every
    kernel of the WGMMA register program's form since D86). The passes' notes, with the reason a kernel stayed
    generic, are ``kernel.meta["attrs"]["hopper_pipelines"]``."""
    notes = kernel.meta["attrs"].get("hopper_pipelines", ())
    taken = [n for n in notes if "not mapped" not in n and "not pipelined" not in n
             and "left to the core's general path" not in n]  # the route "auto" (D61, D77)
    for prefix, path in (("cuda.register_program:", "register program (mma.sync)"),
                         ("cuda.hopper_gemm_pipeline:", "hopper pipeline")):
        if any(n.startswith(prefix) for n in taken):
            return path
    return "generic"


class CUDABackend(Backend):
    name = "cuda"
    plugin_api = "1.13"  # capability_files() / arch_of() from the core's Backend
    distribution = "tilecore-cuda"

    def parse_target(self, spec: str):
        arch = self.arch_of(spec, ARCHS, ALIASES, local_arch)
        if arch is None:
            return None
        return Target(backend=self.name, kind="cuda", arch=arch, capability_id=f"cuda/{arch}")

    def targets(self) -> list:
        return ["cuda:sm_80", "cuda:sm_86", "cuda:sm_89", "cuda:sm_90a"]

    def probe(self) -> Probe:
        try:
            tc = toolchain()
        except Exception:  # noqa: BLE001 - a probe never raises
            tc = ""
        if not tc:
            return Probe("no-toolchain", detail="neither NVRTC with the CUDA headers (pip install "
                                                "'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-runtime==13.0.*' "
                                                "'cuda-bindings==13.0.*') nor nvcc found")
        try:
            n = device_count()
        except Exception:  # noqa: BLE001
            n = 0
        if n == 0:
            return Probe("no-device", toolchain=tc, detail="no CUDA device: kernels compile only")
        devices = []
        caps: dict = {}
        for k in range(n):
            p = device_properties(k)
            devices.append(DeviceInfo(p.get("name", "CUDA device"), k, {
                "compute_capability": f"{p.get('cc_major', 0)}.{p.get('cc_minor', 0)}",
                "arch": arch_of(p), "sm_count": p.get("sm_count"),
                "shared_bytes_per_block": p.get("shared_per_block"),
                "shared_bytes_per_block_optin": p.get("shared_per_block_optin")}))
            if k == 0:
                if "shared_per_block_optin" in p:
                    caps["memory.shared.max_bytes_per_block"] = p["shared_per_block_optin"]
                if "max_threads_per_block" in p:
                    caps["execution.max_threads_per_block"] = p["max_threads_per_block"]
        return Probe("ok", tuple(devices), caps, toolchain=tc)

    def intrinsics(self, target) -> list:
        from .intrinsics import TABLE

        return list(TABLE)

    def passes(self, target) -> list:
        from tilecore.passes.simt import simt_distribute  # compile-time only: loading a kernel needs no passes

        from ._prune import prune_barriers_by_default
        from .hopper import hopper_gemm_pipeline
        from .intrinsics import mark_block_threads
        from .regprog import register_program, route_shape_defaults

        return [PassSpec("layout", route_shape_defaults, position="before"),
                PassSpec("tile-lowering", hopper_gemm_pipeline, position="before"),
                PassSpec("tile-lowering", register_program, position="before"),
                PassSpec("tile-lowering", mark_block_threads, position="before"),
                PassSpec("before-codegen", simt_distribute, position="before"),
                PassSpec("before-codegen", prune_barriers_by_default, position="before")]

    def matrix_units(self, target) -> list:
        from .units import units

        return units(target)

    def emitter(self, target):
        return CUDAEmitter()

    def runtime(self, target):
        return CUDARuntime(target.arch or DEFAULT_ARCH)

    def toolchain_version(self, target) -> str:
        return toolchain()

    def disassemble(self, binary: bytes, target) -> str:
        """SASS of a cubin through ``cuobjdump -sass`` (``pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``)."""
        tool = shutil.which("cuobjdump")
        if tool is None:
            try:
                import nvidia  # type: ignore

                for root in getattr(nvidia, "__path__", []):
                    for cand in Path(root).glob("*/bin/cuobjdump"):
                        tool = str(cand)
            except ImportError:
                pass
        if tool is None:
            raise SystemExit("tilecore compile --emit asm: cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, "
                             "or put the CUDA toolkit's bin/ on PATH)")
        with tempfile.TemporaryDirectory(prefix="tilecore-cuda-asm-") as tmp:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(binary)
            env = dict(os.environ)
            disasm = shutil.which("nvdisasm") or str(Path(tool).with_name("nvdisasm"))
            if Path(disasm).exists():
                env.setdefault("NVDISASM_PATH", str(Path(disasm).parent))
                env["PATH"] = str(Path(disasm).parent) + os.pathsep + env.get("PATH", "")
            proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"cuobjdump failed: {proc.stderr.strip()}")
            return proc.stdout


@hookimpl
def tilecore_backends():
    return [CUDABackend()]
