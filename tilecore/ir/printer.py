"""Text form of the tile IR: what ``--emit ir`` and ``TILECORE_DUMP_IR`` show, and what the kernel
cache hashes. The form is deterministic: the same kernel always prints the same text, and unambiguous:
in a function, two variables or buffers of one name (a user's ``i`` and a lowering's ``i``) print with
different names (``i``, ``i_1``), in order of first appearance.
"""
from __future__ import annotations

import math
from contextvars import ContextVar

from .buffer import Region
from .expr import (BinOp, BufferLoad, Call, Cast, Cmp, Expr, FloatImm, IntImm, Logic, Select, ShuffleIndex, ShuffleWidth, ShuffleXor,
                   ThreadIndex, Var)
from .stmt import (Allocate, Assert, Assume, AsyncCommit, AsyncCopy, AsyncWait, Atomic, Barrier, Bind, Break, BulkCopy, BulkFence, BulkStore, BulkStoreWait,
                   Collective, Continue, CopyBarrierArrive, CopyBarrierInit, CopyBarrierWait, Specialized, StageRelease, Turn,
                   For, Hint, If, KernelLaunch, MatrixLoad, MatrixStore, VectorStore, MatrixOp, MatrixSync, PerThread, Print,
                   PrimFunc, Seq, Stmt, Store, TileOp)

_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
        "shl": "<<", "shr": ">>", "xor": "^", "bitand": "&", "bitor": "|"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


#: while a function prints: id -> (object, printed name), and the printed names in use
_NAMES: ContextVar = ContextVar("tilecore_printer_names", default=None)


def _nm(obj) -> str:
    """``obj.name``, made unique by identity inside the function being printed."""
    scope = _NAMES.get()
    if scope is None:
        return obj.name
    table, used = scope
    got = table.get(id(obj))
    if got is None:
        cand, n = obj.name, 1
        while cand in used:
            cand, n = f"{obj.name}_{n}", n + 1
        used.add(cand)
        got = table[id(obj)] = (obj, cand)
    return got[1]


def expr_str(e) -> str:
    if isinstance(e, Var):
        return _nm(e)
    if isinstance(e, IntImm):
        return str(e.value) if e.dtype in ("int32", "bool") else f"T.{e.dtype}({e.value})"
    if isinstance(e, FloatImm):
        v = e.value
        text = repr(v) if math.isfinite(v) else ("T.infinity" if v > 0 else "-T.infinity") if not math.isnan(v) else "nan"
        return text if e.dtype == "float32" else f"T.{e.dtype}({text})"
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return f"T.{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
        return f"({expr_str(e.a)} {_BIN[e.op]} {expr_str(e.b)})"
    if isinstance(e, Cmp):
        return f"({expr_str(e.a)} {_CMP[e.op]} {expr_str(e.b)})"
    if isinstance(e, Logic):
        if e.op == "not":
            return f"(not {expr_str(e.a)})"
        return f"({expr_str(e.a)} {e.op} {expr_str(e.b)})"
    if isinstance(e, Select):
        return f"T.if_then_else({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"
    if isinstance(e, Cast):
        return f"T.{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Call):
        attrs = "".join(f", {k}={v!r}" for k, v in e.attrs)
        return f"T.{e.name}({', '.join(expr_str(a) for a in e.args)}{attrs}):{e.dtype}"
    if isinstance(e, BufferLoad):
        return f"{_nm(e.buffer)}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, ThreadIndex):
        return "T.thread_index()"
    if type(e).__name__ == "AtomicRet":
        idx = ", ".join(expr_str(i) for i in e.indices)
        return (f"T.atomic_{e.op}({_nm(e.buffer)}[{idx}], {expr_str(e.value)}, return_prev=True, "
                f"memory_order={e.order!r}, scope={e.scope!r})")
    if isinstance(e, ShuffleWidth):
        return "T.shuffle_width()"
    if isinstance(e, ShuffleXor):
        return f"T.shuffle_xor({expr_str(e.value)}, {e.mask}, width={e.width})"
    if isinstance(e, ShuffleIndex):
        return f"T.shuffle({expr_str(e.value)}, {expr_str(e.lane)}, width={e.width})"
    if isinstance(e, Region):
        return region_str(e)
    if isinstance(e, Expr):
        return f"<{type(e).__name__}>"
    return repr(e)


def region_str(r: Region) -> str:
    parts = []
    for s, n in zip(r.starts, r.extents):
        parts.append(f"{expr_str(s)}:+{expr_str(n)}")
    return f"{_nm(r.buffer)}[{', '.join(parts)}]"


def _arg_str(a) -> str:
    if isinstance(a, Region):
        return region_str(a)
    if isinstance(a, Expr):
        return expr_str(a)
    return repr(a)


def stmt_lines(s: Stmt | None, indent: int = 0) -> list:
    pad = "    " * indent
    if s is None:
        return []
    if isinstance(s, Seq):
        out: list = []
        for c in s.body:
            out.extend(stmt_lines(c, indent))
        return out or [pad + "pass"]
    if isinstance(s, KernelLaunch):
        grid = ", ".join(expr_str(g) for g in s.grid)
        names = ", ".join(_nm(v) for v in s.block_vars)
        ext = "".join(f", {k}={v!r}" for k, v in dict(s.attrs).get("extensions", ()))  # backend extensions
        head = f"{pad}with T.Kernel({grid}, threads={tuple(s.threads)}{ext}) as ({names}):"
        return [head] + stmt_lines(s.body, indent + 1)
    if isinstance(s, For):
        ann = "".join(f", {k}={v!r}" for k, v in sorted(s.annotations.items()))
        head = f"{pad}for {_nm(s.var)} in T.{s.kind}({expr_str(s.start)}, {expr_str(s.extent)}{ann}):"
        return [head] + stmt_lines(s.body, indent + 1)
    if isinstance(s, PerThread):
        attrs = "".join(f", {k}={v!r}" for k, v in sorted(s.attrs.items()))
        return [f"{pad}with T.per_thread({attrs.lstrip(', ')}):"] + stmt_lines(s.body, indent + 1)
    if isinstance(s, If):
        out = [f"{pad}if {expr_str(s.cond)}:"] + stmt_lines(s.then, indent + 1)
        if s.orelse is not None:
            out += [f"{pad}else:"] + stmt_lines(s.orelse, indent + 1)
        return out
    if isinstance(s, Store):
        idx = ", ".join(expr_str(i) for i in s.indices)
        return [f"{pad}{_nm(s.buffer)}[{idx}] = {expr_str(s.value)}"]
    if isinstance(s, Bind):
        return [f"{pad}{_nm(s.var)}: {s.var.dtype} = {expr_str(s.value)}"]
    if isinstance(s, Allocate):
        b = s.buffer
        shape = ", ".join(expr_str(x) for x in b.shape)
        init = f", init={expr_str(s.init)}" if s.init is not None else ""
        return [f"{pad}{_nm(b)} = T.alloc_{b.scope}(({shape},), {b.dtype!r}{init})"]
    if isinstance(s, Atomic):
        idx = ", ".join(expr_str(i) for i in s.indices)
        return [f"{pad}T.atomic_{s.op}({_nm(s.buffer)}[{idx}], {expr_str(s.value)})"]
    if type(s).__name__ == "GroupBarrier":
        return [f"{pad}T.group_barrier({s.phase!r}, order={s.order!r})"]
    if type(s).__name__ == "PeerStore":
        idx = ", ".join(expr_str(i) for i in s.indices)
        vals = ", ".join(expr_str(v) for v in s.values)
        bar = f", barrier={_nm(s.barrier)}[{expr_str(s.barrier_index)}]" if s.barrier is not None else ""
        return [f"{pad}T.peer_store({_nm(s.buffer)}[{idx}], ({vals}), rank={expr_str(s.rank)}{bar})"]
    if type(s).__name__ == "Fence":
        return [f"{pad}T.fence(scope={s.scope!r}, order={s.order!r})"]
    if isinstance(s, Print):
        what = _nm(s.buffer) if s.buffer is not None else expr_str(s.value)
        return [f"{pad}T.print({what}, msg={s.message!r})"]
    if isinstance(s, Assert):
        vals = f", values=({', '.join(expr_str(v) for v in s.values)},)" if s.values else ""
        return [f"{pad}T.device_assert({expr_str(s.cond)}, {s.message!r}{vals})"]
    if isinstance(s, Assume):
        return [f"{pad}T.assume({expr_str(s.cond)})"]
    if isinstance(s, Barrier):
        return [f"{pad}T.barrier({f'threads={s.threads}' if s.threads else ''})"]
    if isinstance(s, Turn):
        return [f"{pad}T.turn_{s.phase}(groups={s.groups}, group_threads={s.group_threads})"]
    if isinstance(s, StageRelease):
        return [f"{pad}T.stage_release({_nm(s.barrier)}[{expr_str(s.index)}]"
                + (f", group={s.group}" if getattr(s, "group", 1) != 1 else "") + ")"]
    if isinstance(s, Specialized):
        return ([f"{pad}with T.producer(consumers={s.consumers}):"] + stmt_lines(s.producer, indent + 1)
                + [f"{pad}with T.consumers({s.consumers}):"] + stmt_lines(s.consumer, indent + 1))
    if isinstance(s, AsyncCopy):
        dst = ", ".join(expr_str(i) for i in s.dst_indices)
        src = ", ".join(expr_str(i) for i in s.src_indices)
        return [f"{pad}T.async_copy({_nm(s.dst)}[{dst}], {_nm(s.src)}[{src}], elements={s.elements}, "
                f"pred={expr_str(s.pred)})"]
    if isinstance(s, AsyncCommit):
        return [f"{pad}T.async_commit()"]
    if isinstance(s, AsyncWait):
        return [f"{pad}T.async_wait(pending={s.pending})"]
    if isinstance(s, Break):
        return [f"{pad}break"]
    if isinstance(s, Continue):
        return [f"{pad}continue"]
    if isinstance(s, Hint):
        return [f"{pad}T.hint({s.kind!r}, {_hint_payload(s.payload)})"]
    if isinstance(s, Collective):
        args = "".join(f", {_arg_str(a)}" for a in s.args)
        attrs = "".join(f", {k}={_arg_str(v)}" for k, v in sorted(s.attrs.items()))
        threads = f", threads={s.threads}" if s.threads is not None else ""
        return [f"{pad}T.collective({s.name!r}{args}{attrs}{threads})"]
    if isinstance(s, VectorStore):
        idx = ", ".join(expr_str(i) for i in s.indices)
        vals = ", ".join(expr_str(v) for v in s.values)
        if s.vector_load:  # one read of consecutive elements (its first, then how many)
            vals = f"{expr_str(s.values[0])}:+{s.lanes}"
        return [f"{pad}{_nm(s.buffer)}[{idx}:+{s.lanes}] = T.vector({vals})"]
    if isinstance(s, MatrixStore):
        idx = ", ".join(expr_str(i) for i in s.indices)
        vals = ", ".join(expr_str(v) for v in s.values)
        return [f"{pad}T.matrix_store({_nm(s.buffer)}[{idx}], ({vals}), 4 x 8x8)"]
    if isinstance(s, MatrixLoad):
        return [f"{pad}T.matrix_load({s.spelling!r}, {s.operand!r}, {_nm(s.dst)}[{s.dst_offset}:], "
                f"{expr_str(s.origin)}, lane={expr_str(s.lane)}, trans={s.trans}, align={s.align})"]
    if isinstance(s, MatrixOp):
        def operand(x):
            origin = getattr(s, f"{x}_origin")
            if origin is not None:  # read from shared memory by the instruction
                return f"{expr_str(origin)}, {x}_trans={bool(s.attrs.get(x + '_trans'))}"
            return f"{_nm(getattr(s, x))}[{getattr(s, x + '_offset')}:]"
        return [f"{pad}T.matrix_op({s.spelling!r}, {_nm(s.c)}[{s.c_offset}:], {operand('a')}, {operand('b')})"]
    if isinstance(s, MatrixSync):
        return [f"{pad}T.matrix_sync({s.spelling!r}, {s.phase!r}{f', pending={s.pending}' if s.pending else ''})"]
    if isinstance(s, BulkCopy):
        dst = ", ".join(expr_str(i) for i in s.dst_indices)
        starts = ", ".join(expr_str(i) for i in s.starts)
        lay = f"{s.layout.swizzle_bytes}-byte panels" if getattr(s.layout, "panels", False) else "row-major"
        return [f"{pad}T.bulk_copy({_nm(s.dst)}[{dst}], {_nm(s.src)}[{starts}], box={tuple(s.box)}, {lay}, "
                f"barrier={_nm(s.barrier)}[{expr_str(s.index)}]"
                + (f", when={expr_str(s.when)}" if s.when is not None else "")
                + (f", multicast={s.multicast}" if getattr(s, "multicast", 1) != 1 else "") + ")"]
    if isinstance(s, BulkStore):
        starts = ", ".join(expr_str(i) for i in s.starts)
        part = (f", panels=({expr_str(s.panels[0])}, {s.panels[1]})" if s.panels is not None else "") + \
            (f", cells=({expr_str(s.cells[0])}, {expr_str(s.cells[1])}, rows={s.cells[2]})" if s.cells is not None
             else "")
        return [f"{pad}T.bulk_store({_nm(s.dst)}[{starts}], {_nm(s.src)}, box={tuple(s.box)}, "
                f"{s.layout.swizzle_bytes}-byte panels{part})"]
    if isinstance(s, BulkStoreWait):
        return [f"{pad}T.bulk_store_wait(pending={s.pending}{', read' if s.read else ''})"]
    if isinstance(s, BulkFence):
        return [f"{pad}T.bulk_fence()"]
    if isinstance(s, CopyBarrierInit):
        return [f"{pad}T.copy_barrier_init({_nm(s.barrier)}, count={s.count})"]
    if isinstance(s, CopyBarrierArrive):
        return [f"{pad}T.copy_barrier_arrive({_nm(s.barrier)}[{expr_str(s.index)}], bytes={s.bytes})"]
    if isinstance(s, CopyBarrierWait):
        issuer = ", issuer=True" if getattr(s, "issuer", False) else ""
        return [f"{pad}T.copy_barrier_wait({_nm(s.barrier)}[{expr_str(s.index)}], parity={expr_str(s.parity)}{issuer})"]
    if isinstance(s, TileOp):
        args = ", ".join(_arg_str(a) for a in s.args)
        attrs = "".join(f", {k}={_arg_str(v)}" for k, v in sorted(s.attrs.items()))
        return [f"{pad}T.{s.op}({args}{attrs})"]
    return [f"{pad}<{type(s).__name__}>"]


def _hint_payload(p: dict) -> str:
    return "{" + ", ".join(f"{k!s}: {getattr(v, 'name', v)!s}" for k, v in sorted(p.items(), key=str)) + "}"


def func_str(f: PrimFunc) -> str:
    token = _NAMES.set(({}, set()))
    try:
        params = []
        for p in f.params:
            if p.buffer is not None:
                shape = ", ".join(expr_str(s) for s in p.buffer.shape)
                kind = "T.Workspace" if p.workspace else "T.Tensor"
                params.append(f"{_nm(p.buffer)}: {kind}(({shape},), {p.buffer.dtype!r})")
            else:
                params.append(f"{_nm(p.var)}: T.{p.var.dtype}")
        lines = ["@T.prim_func", f"def {f.name}({', '.join(params)}):"]
        for k, v in sorted(f.attrs.items()):
            lines.append(f"    # attr {k} = {v!r}")
        lines += stmt_lines(f.body, 1)
    finally:
        _NAMES.reset(token)
    return "\n".join(lines) + "\n"
