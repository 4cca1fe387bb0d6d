"""The calling convention between generated kernels and the core's argument binding.

Every kernel entry takes three arrays: buffer addresses in parameter order, 64-bit integers (integer
scalar parameters, then the symbolic dimensions of the tensors' shapes), and doubles (float scalar
parameters). Emitters and the binding layer both derive the order from :func:`abi_of`, so they agree.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError
from ..ir import BinOp, Bind, Cast, Cmp, IntImm, Logic, KernelLaunch, Seq, Var, collect, is_float, simplify


@dataclass(frozen=True)
class KernelABI:
    buffers: tuple       # Param objects with a buffer
    ints: tuple          # Vars: integer scalar params, then shape symbols
    floats: tuple        # Vars: float scalar params
    shape_symbols: tuple  # Vars bound from tensor shapes


def abi_of(func) -> KernelABI:
    buffers = tuple(p for p in func.params if p.buffer is not None)
    scalars = [p.var for p in func.params if p.var is not None]
    ints = [v for v in scalars if not is_float(v.dtype)]
    floats = tuple(v for v in scalars if is_float(v.dtype))
    symbols = tuple(v for v in func.shape_vars() if not any(v is s for s in scalars))
    return KernelABI(buffers, tuple(ints) + symbols, floats, symbols)


def single_launch(func) -> tuple:
    """``(launch, top)`` of a kernel a one-launch backend can emit: exactly one ``T.Kernel``, and at the top
    level nothing but it and scalar bindings (``top``, in order). Raises CompileError otherwise."""
    launches = collect(func.body, KernelLaunch)
    if len(launches) != 1:
        raise CompileError(f"kernel {func.name}: this backend needs exactly one T.Kernel per function, "
                           f"found {len(launches)}", func.span)
    top = func.body.body if isinstance(func.body, Seq) else [func.body]
    for s in top:
        if not isinstance(s, (KernelLaunch, Bind)):
            raise CompileError(f"kernel {func.name}: statements outside T.Kernel ({type(s).__name__}) are not "
                               "supported by this backend", s.span)
    return launches[0], top


_HOST_OPS = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "floormod": "%", "shl": "<<", "shr": ">>",
             "bitand": "&", "bitor": "|", "xor": "^"}
_HOST_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def host_expr(e, ints) -> str:
    """A Python expression computing the integer ``e`` from the ABI integers (``ints[k]``, ``ints`` as in
    :attr:`KernelABI.ints`). Backends put such expressions in ``Source.meta`` (grid sizes, tensor sizes),
    so a launcher, or a kernel loaded from an export, evaluates them without the compiler."""
    e = simplify(e)
    if isinstance(e, IntImm):
        return str(e.value)
    if isinstance(e, Var):
        for k, v in enumerate(ints):
            if v is e:
                return f"ints[{k}]"
        raise CompileError(f"{e.name} is needed at launch (a grid or tensor size) but is not a kernel argument")
    if isinstance(e, Cast) and not is_float(e.dtype) and not is_float(e.value.dtype):
        return host_expr(e.value, ints)
    if isinstance(e, BinOp) and not is_float(e.dtype):
        a, b = host_expr(e.a, ints), host_expr(e.b, ints)
        if e.op in _HOST_OPS:
            return f"({a} {_HOST_OPS[e.op]} {b})"
        if e.op in ("min", "max"):
            return f"{e.op}({a}, {b})"
        if e.op == "div":
            return f"int({a} / {b})"
    # conditions (1 or 0): a launch-time test the kernel repeats, e.g. a versioned loop's (BulkCopy.when)
    if isinstance(e, Cmp) and e.op in _HOST_CMP:
        return f"int({host_expr(e.a, ints)} {_HOST_CMP[e.op]} {host_expr(e.b, ints)})"
    if isinstance(e, Logic):
        if e.op == "not":
            return f"int(not {host_expr(e.a, ints)})"
        return f"int({host_expr(e.a, ints)} {e.op} {host_expr(e.b, ints)})"
    raise CompileError(f"the size {e!r} cannot be computed at launch by this backend")
