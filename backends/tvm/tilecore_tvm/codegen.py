"""The emitter of tilecore-tvm: the lowered kernel, bridged (``bridge.py``), compiled by TVM in the worker.

``Source.code`` is what TVM's code generator wrote: Metal Shading Language, OpenCL C or WGSL for the
source targets, the AMDGPU assembly of the code object for ``tvm:rocm:<gfx>`` (the code object itself
is the build's binary). ``Source.meta`` keeps the bridged program and TVM's target, so a kernel loaded
from the disk cache in another process can be rebuilt, plus the launch geometry.
"""
from __future__ import annotations

from tilecore.codegen import abi_of, host_expr, single_launch
from tilecore.plugin import Emitter, Source

from .bridge import bridge
from .runtime import compile_program, remember_binary

#: Source.lang per TVM target kind (also the extension of dumps and exports)
LANGS = {"metal": "metal", "opencl": "cl", "webgpu": "wgsl", "rocm": "s"}


def tvm_target(target) -> dict:
    """TVM's JSON target for a tilecore target (``tvm:metal`` ... ``tvm:rocm:gfx942``)."""
    arch = target.arch or ""
    if arch.startswith("rocm:"):
        return {"kind": "rocm", "mcpu": arch.split(":", 1)[1]}
    return {"kind": arch}


class TVMEmitter(Emitter):
    def emit(self, func, ctx) -> Source:
        tgt = tvm_target(ctx.target)
        program = bridge(func, ctx)
        reply = compile_program(program, tgt)
        remember_binary(reply["source"], reply["binary"])
        abi = abi_of(func)
        launch, _ = single_launch(func)
        meta = {"program": program, "tvm_target": tgt, "target": str(ctx.target),
                "grid": [host_expr(g, abi.ints) for g in launch.grid], "threads": program["threads"],
                "nints": len(abi.ints), "nfloats": len(abi.floats)}
        return Source(reply["source"], LANGS[tgt["kind"]], program["name"] + "_kernel", meta)
