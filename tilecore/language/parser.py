"""Parser hooks: turn the Python source of a ``@T.prim_func`` / ``@T.macro`` into tile IR.

The body is interpreted statement by statement. Expressions are ordinary Python, evaluated with the
kernel's globals and closure, on IR values whose operators build expressions; statements become IR:

- ``for`` over ``T.Parallel`` / ``T.Pipelined`` / ``T.serial`` / ``range`` builds loops; ``for`` over a
  Python list or tuple unrolls in Python (meta-programming);
- ``if`` on a Python value picks a branch now; ``if`` on a symbolic value builds a branch in the IR;
- ``name = <symbolic expr>`` binds an immutable scalar; ``buf[i] = v`` stores; a name that holds a
  ``T.alloc_var`` stores into it;
- ``with T.Kernel(...) as (bx, by)`` opens the launch.

Scalar names follow the IR's scoping, not Python's: a name bound inside a symbolic loop or branch is not
visible after it, and rebinding an outer name inside one is an error (a value that changes across
iterations must be a ``T.alloc_var``). Both are reported at the line, instead of silently giving a
different answer from Python.
"""
from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from dataclasses import dataclass

from ..errors import CompileError, ParseError, Span
from ..ir import (Allocate, Assert, Bind, Break, Buffer, BufferLoad, Continue, DType, Expr, For, If,
                  KernelLaunch, Param, PrimFunc, Region, Store, Var, as_expr, binary, cast, compare, const,
                  const_value, logic_and, logic_not, logic_or, maximum, minimum, select)
from ..ir.dtypes import canonical
from .builder import Builder, building


@dataclass
class LoopSpec:
    """What ``T.Parallel(...)``, ``T.Pipelined(...)``, ``T.serial(...)`` and ``range(...)`` return."""

    starts: tuple
    extents: tuple
    kind: str
    annotations: dict
    step: object = 1


@dataclass
class TensorSpec:
    """A parameter annotation: ``T.Tensor(shape, dtype)``."""

    shape: tuple
    dtype: str


@dataclass
class BufferSpec:
    """A @T.macro parameter annotation: ``T.SharedBuffer(shape, dtype)``, ``T.FragmentBuffer``..."""

    shape: tuple
    dtype: str
    scope: str


@dataclass
class KernelSpec:
    grid: tuple
    threads: tuple
    attrs: dict


class _Tombstone:
    def __init__(self, name: str, span):
        self.name, self.span = name, span


class _Return(Exception):
    def __init__(self, value):
        self.value = value


def _range(*args):
    from . import serial

    return serial(*args)


def _and(*xs):
    out = xs[0]
    for x in xs[1:]:
        if isinstance(out, Expr) or isinstance(x, Expr):
            out = logic_and(out, x)
        else:
            out = out and x
    return out


def _or(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = logic_or(out, x) if isinstance(out, Expr) or isinstance(x, Expr) else (out or x)
    return out


def _not(x):
    return logic_not(x) if isinstance(x, Expr) else (not x)


def _symbolic(c) -> bool:
    return isinstance(c, Expr) and const_value(c) is None


def _truth(c):
    return const_value(c) if isinstance(c, Expr) else c


class _Rewrite(ast.NodeTransformer):
    """Make ``and`` / ``or`` / ``not`` / ``x if c else y`` / ``a < b < c`` work on IR values."""

    def _call(self, name, args, node):
        return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), args, []), node)

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        return self._call("__tc_and" if isinstance(node.op, ast.And) else "__tc_or", node.values, node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        return self._call("__tc_not", [node.operand], node) if isinstance(node.op, ast.Not) else node

    def visit_IfExp(self, node):
        # `x if c else y`: a symbolic c selects in the IR (both arms built); a Python c evaluates only the
        # taken arm, as in Python:  T.if_then_else(t, x, y) if symbolic(t := c) else (x if truth(t) else y)
        self.generic_visit(node)
        self.n = getattr(self, "n", 0) + 1
        tmp = f"__tc_c{self.n}"
        test = ast.NamedExpr(ast.Name(tmp, ast.Store()), node.test)
        both = self._call("__tc_select", [ast.Name(tmp, ast.Load()), node.body, node.orelse], node)
        one = ast.IfExp(self._call("__tc_truth", [ast.Name(tmp, ast.Load())], node), _deepcopy(node.body),
                        _deepcopy(node.orelse))
        return ast.copy_location(ast.IfExp(self._call("__tc_symbolic", [test], node), both, one), node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) == 1:
            return node
        parts, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            parts.append(ast.Compare(left, [op], [right]))
            left = right
        return self._call("__tc_and", parts, node)


_HELPERS = {"__tc_and": _and, "__tc_or": _or, "__tc_not": _not, "__tc_symbolic": _symbolic, "__tc_truth": _truth,
            "__tc_select": select, "range": _range}


class _Scope:
    """The name lookup of kernel code: IR scopes, then closure; globals come from ``eval``."""

    def __init__(self, interp: "Interpreter"):
        self.interp = interp
        self.temps: dict = {}  # the conditions of `x if c else y` (see _Rewrite.visit_IfExp)

    def __setitem__(self, name, value):
        self.temps[name] = value

    def __getitem__(self, name):
        if name in self.temps:
            return self.temps[name]
        for layer in reversed(self.interp.layers):
            if name in layer:
                v = layer[name]
                if isinstance(v, _Tombstone):
                    raise ParseError(
                        f"`{name}` was bound inside a symbolic loop or branch (line {v.span.line}) and is "
                        "not visible after it; declare it before with T.alloc_var(dtype) and assign to it",
                        self.interp.builder.span)
                if isinstance(v, Buffer) and v.scope == "var":
                    return BufferLoad(v, (0,))
                return v
        if name in _HELPERS:
            return _HELPERS[name]
        raise KeyError(name)


class Interpreter:
    def __init__(self, fn, builder: Builder, bindings: dict | None = None, outer: dict | None = None):
        self.fn = fn
        self.builder = builder
        try:
            src = textwrap.dedent(inspect.getsource(fn))
        except (OSError, TypeError):
            raise ParseError(f"cannot read the source of kernel {getattr(fn, '__qualname__', fn)!r}: tilecore "
                             "parses kernels from their source text, which Python keeps only for functions "
                             "defined in a file (not in the REPL, `python -c` or exec'd strings); put the "
                             "kernel in a .py file and import or run it") from None
        self.tree = ast.parse(src)
        self.fdef = self.tree.body[0]
        if not isinstance(self.fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise ParseError(f"{fn!r} is not a function definition")
        self.file = inspect.getsourcefile(fn) or "<unknown>"
        self.offset = fn.__code__.co_firstlineno - 1  # ast line 1 is the first decorator
        self.globals = fn.__globals__
        closure = {}
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    closure[name] = cell.cell_contents
                except ValueError:  # an unassigned cell
                    pass
        # The defining scope's locals come first (lowest priority): with `from __future__ import
        # annotations`, annotations may name a factory's arguments that the closure does not hold.
        self.layers: list = [dict(outer or {}), closure, dict(bindings or {})]
        self.scope = _Scope(self)
        self._code: dict = {}

    # -- helpers --------------------------------------------------------------------------------
    def span(self, node) -> Span:
        return Span(self.file, node.lineno + self.offset, self.fdef.name)

    def eval(self, node):
        # compiled once per node; the entry holds the node, so its id is not reused by a later node (an
        # augmented assignment's load is a node made on the spot: keyed by id alone, a later one could get
        # the code of an earlier one, freed, at the same address)
        hit = self._code.get(id(node))
        code = hit[1] if hit is not None and hit[0] is node else None
        if code is None:
            tree = ast.Expression(_Rewrite().visit(_deepcopy(node)))
            ast.fix_missing_locations(tree)
            code = compile(tree, self.file, "eval")
            self._code[id(node)] = (node, code)
        try:
            return eval(code, self.globals, self.scope)  # noqa: S307 - the user's own kernel code
        except CompileError as e:
            if e.span is None:
                e.span = self.builder.span
                e.args = (f"{e.span}: {e.bare_message}",)
            raise
        except (NameError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
            raise ParseError(f"{type(e).__name__}: {e}", self.builder.span) from e

    def lookup_raw(self, name):
        for layer in reversed(self.layers):
            if name in layer:
                return layer[name], layer
        return None, None

    def bind(self, name: str, value) -> None:
        b = self.builder
        existing, layer = self.lookup_raw(name)
        if isinstance(existing, Buffer) and existing.scope == "var" and not isinstance(value, Buffer):
            b.emit(Store(existing, (as_expr(0),), cast(existing.dtype, as_expr(value, existing.dtype))))
            return
        top = self.layers[-1]
        if layer is not None and layer is not top and not isinstance(existing, _Tombstone) and len(self.layers) > 2:
            if self._symbolic_depth_of(layer) < self._symbolic_depth:
                raise ParseError(
                    f"`{name}` is assigned inside a symbolic loop or branch but was defined outside it; "
                    "a value that changes across iterations must be declared with T.alloc_var(dtype)",
                    b.span)
        if isinstance(value, Buffer) and getattr(value, "_unnamed", False):
            value.name = b.fresh(name)
            value._unnamed = False
        if isinstance(value, Expr) and const_value(value) is None and not isinstance(value, Var):
            var = Var(b.fresh(name), value.dtype)
            b.emit(Bind(var, value))
            value = var
        top[name] = value

    # symbolic IR scopes are marked by pushing a layer with a marker key
    @property
    def _symbolic_depth(self) -> int:
        return sum(1 for layer in self.layers if layer.get("__tc_symbolic__"))

    def _symbolic_depth_of(self, layer) -> int:
        depth = 0
        for lay in self.layers:
            if lay.get("__tc_symbolic__"):
                depth += 1
            if lay is layer:
                return depth
        return depth

    def push_scope(self, symbolic: bool = True) -> None:
        self.layers.append({"__tc_symbolic__": True} if symbolic else {})
        self.builder.push()

    def pop_scope(self):
        layer = self.layers.pop()
        body = self.builder.pop()
        for name in layer:
            if name != "__tc_symbolic__" and self.lookup_raw(name)[0] is None:
                self.layers[-1][name] = _Tombstone(name, self.builder.span)
        return body

    # -- statements -----------------------------------------------------------------------------
    def run_body(self, stmts) -> None:
        for node in stmts:
            self.builder.span = self.span(node)
            method = getattr(self, "visit_" + type(node).__name__, None)
            if method is None:
                raise ParseError(f"`{type(node).__name__}` statements are not supported in kernels",
                                 self.builder.span)
            method(node)

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.eval(node.value)

    def visit_Pass(self, node):
        pass

    def visit_Assign(self, node):
        value = self.eval(node.value)
        for target in node.targets:
            self.assign(target, value)

    def visit_AnnAssign(self, node):
        if node.value is None:
            eager = self.builder.eager
            if eager is not None and isinstance(node.target, ast.Name) and node.target.id in eager.pending:
                eager.declare(self, node.target.id, self.eval(node.annotation))  # `A: T.Tensor(...)`
            return
        value = self.eval(node.value)
        ann = self.eval(node.annotation)
        if isinstance(ann, DType):
            value = cast(ann, as_expr(value, ann))
            if const_value(value) is not None:  # keep it a runtime value, as annotated
                var = Var(self.builder.fresh(node.target.id), ann)
                self.builder.emit(Bind(var, value))
                value = var
        self.assign(node.target, value)

    def visit_AugAssign(self, node):
        op = _AUG.get(type(node.op))
        if op is None:
            raise ParseError(f"augmented assignment {type(node.op).__name__} is not supported", self.builder.span)
        load = ast.copy_location(_load(node.target), node)
        cur = self.eval(load)
        rhs = self.eval(node.value)
        self.assign(node.target, op(cur, rhs))

    def assign(self, target, value) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = list(value)
            if len(values) != len(target.elts):
                raise ParseError(f"cannot unpack {len(values)} values into {len(target.elts)} names",
                                 self.builder.span)
            for t, v in zip(target.elts, values):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            buf = self.eval(target.value)
            if isinstance(buf, BufferLoad) and buf.buffer.scope == "var":
                buf = buf.buffer
            if not isinstance(buf, Buffer):
                raise ParseError(f"cannot assign into {ast.unparse(target.value)} (not a buffer)", self.builder.span)
            idx = self.eval(target.slice)
            idx = idx if isinstance(idx, tuple) else (idx,)
            if any(isinstance(i, slice) for i in idx):
                raise ParseError("assigning to a slice is not supported; use T.fill(region, value) or "
                                 "T.copy(src, region)", self.builder.span)
            if len(idx) != buf.ndim:
                raise ParseError(f"{buf.name} has {buf.ndim} dims but is indexed with {len(idx)}", self.builder.span)
            if isinstance(value, (Buffer, Region)):
                raise ParseError(f"cannot store a buffer into {buf.name}[...]; use T.copy", self.builder.span)
            self.builder.emit(Store(buf, tuple(as_expr(i) for i in idx), cast(buf.dtype, as_expr(value, buf.dtype))))
        else:
            raise ParseError(f"cannot assign to {ast.unparse(target)}", self.builder.span)

    def visit_For(self, node):
        it = self.eval(node.iter)
        if node.orelse:
            raise ParseError("for ... else is not supported in kernels", self.builder.span)
        if isinstance(it, LoopSpec):
            self._loop(node, it)
        elif isinstance(it, (list, tuple)):
            for value in it:
                self.assign(node.target, value)
                self.run_body(node.body)
        else:
            raise ParseError(f"cannot loop over {type(it).__name__}: use T.Parallel, T.Pipelined, T.serial, "
                             "T.unroll, T.vectorized, range, or a Python list", self.builder.span)

    def _loop(self, node, spec: LoopSpec) -> None:
        targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
        if len(targets) != len(spec.extents):
            raise ParseError(f"{len(spec.extents)} loop dimensions bound to {len(targets)} names", self.builder.span)
        span = self.builder.span
        if spec.kind == "persistent":
            return self._persistent(node, targets, spec, span)
        self.push_scope()
        loop_vars = []
        for t in targets:
            if not isinstance(t, ast.Name):
                raise ParseError("loop targets must be plain names", span)
            v = Var(self.builder.fresh(t.id))
            loop_vars.append(v)
            self.layers[-1][t.id] = v
        self.run_body(node.body)
        body = self.pop_scope()
        self.builder.span = span
        for v, start, extent in reversed(list(zip(loop_vars, spec.starts, spec.extents))):
            if spec.step != 1:  # normalise a stepped loop: v = start + step * i
                raise ParseError("loops with a step other than 1 are not supported yet", span)
            body = For(v, as_expr(start), as_expr(extent), spec.kind, body, dict(spec.annotations), span=span)
        self.builder.emit(body)

    def _persistent(self, node, targets, spec: LoopSpec, span) -> None:
        """``for v0, v1 in T.Persistent(domain, wave, index, group)``, as TileLang numbers the tiles."""
        a = spec.annotations
        domain, wave, index = a["domain"], a["wave_size"], a["index"]
        last = domain[-1]
        g = maximum(const(1), minimum(a["group_size"], last))
        grouped = [binary("floordiv", binary("add", last, binary("sub", g, 1)), g), *domain[:-1], g]
        padded = const(1)
        for d in grouped:
            padded = binary("mul", padded, d)
        b = self.builder
        w = Var(b.fresh("w"))
        self.push_scope()
        rem = binary("add", binary("mul", w, wave), index)
        idxs = [None] * len(grouped)
        for i in range(len(grouped) - 1, 0, -1):
            idxs[i] = binary("floormod", rem, grouped[i])
            rem = binary("floordiv", rem, grouped[i])
        idxs[0] = rem
        coords = [idxs[i + 1] for i in range(len(domain) - 1)]
        coords.append(binary("add", binary("mul", idxs[0], g), idxs[-1]))
        for t, c in zip(targets, coords):
            if not isinstance(t, ast.Name):
                raise ParseError("loop targets must be plain names", span)
            v = Var(b.fresh(t.id))
            b.emit(Bind(v, c))
            self.layers[-1][t.id] = v
        guard = logic_and(compare("lt", binary("add", binary("mul", w, wave), index), padded),
                          compare("lt", coords[-1], last))
        self.push_scope()
        self.run_body(node.body)
        body = self.pop_scope()
        b.span = span
        b.emit(If(guard, body, span=span))
        step = self.pop_scope()
        waves = binary("floordiv", binary("add", padded, binary("sub", wave, 1)), wave)
        b.emit(For(w, const(0), waves, "serial", step, span=span))

    def visit_While(self, node):
        """``while cond: body``: a serial loop that stops when ``cond`` is false, tested before each
        iteration (at most 2**31 - 1 iterations). A Python-constant ``cond`` builds no test."""
        if node.orelse:
            raise ParseError("while ... else is not supported in kernels", self.builder.span)
        span = self.builder.span
        b = self.builder
        self.push_scope()
        cond = self.eval(node.test)
        if isinstance(cond, (Buffer, Region)):
            raise ParseError("a buffer is not a condition", span)
        c = const_value(cond) if isinstance(cond, Expr) else cond
        if isinstance(cond, Expr) and c is None:
            b.emit(If(logic_not(cond), Break(), span=span))
        elif not c:
            self.pop_scope()
            return
        self.run_body(node.body)
        body = self.pop_scope()
        b.span = span
        b.emit(For(Var(b.fresh("while_it")), const(0), const(2**31 - 1), "serial", body, {"while": True}, span=span))

    def visit_If(self, node):
        cond = self.eval(node.test)
        if isinstance(cond, (Buffer, Region)):
            raise ParseError("a buffer is not a condition", self.builder.span)
        c = const_value(cond) if isinstance(cond, Expr) else cond
        if not isinstance(cond, Expr) or c is not None:
            self.run_body(node.body if c else node.orelse)
            return
        span = self.builder.span
        self.push_scope()
        self.run_body(node.body)
        then = self.pop_scope()
        orelse = None
        if node.orelse:
            self.push_scope()
            self.run_body(node.orelse)
            orelse = self.pop_scope()
        self.builder.emit(If(cond, then, orelse, span=span))

    def visit_With(self, node):
        if len(node.items) != 1:
            raise ParseError("one context per `with` in kernels", self.builder.span)
        item = node.items[0]
        ctx = self.eval(item.context_expr)
        if not isinstance(ctx, KernelSpec):
            raise ParseError("only `with T.Kernel(...)` is supported in kernels", self.builder.span)
        b = self.builder
        if b.in_kernel:
            raise ParseError("T.Kernel cannot be nested", b.span)
        span = b.span
        var = item.optional_vars
        ndim = len(ctx.grid)
        if isinstance(var, ast.Tuple):
            if len(var.elts) != ndim:
                raise ParseError(f"T.Kernel with {ndim} grid dims binds {ndim} names, got {len(var.elts)}", span)
            names = [t.id for t in var.elts]
        elif isinstance(var, ast.Name) and ndim == 1:
            names = [var.id]
        else:
            names = ["bx", "by", "bz"][:ndim]
        block_vars = tuple(Var(b.fresh(n)) for n in names)
        self.push_scope(symbolic=False)  # the body runs once per block: rebinding names is fine
        if isinstance(var, ast.Name):
            self.layers[-1][var.id] = block_vars[0] if ndim == 1 else block_vars
        elif isinstance(var, ast.Tuple):
            for n, v in zip(names, block_vars):
                self.layers[-1][n] = v
        b.in_kernel = True
        try:
            self.run_body(node.body)
        finally:
            b.in_kernel = False
        body = self.pop_scope()
        b.emit(KernelLaunch(ctx.grid, block_vars, ctx.threads, body, dict(ctx.attrs), span=span))

    def visit_Assert(self, node):
        cond = self.eval(node.test)
        msg = self.eval(node.msg) if node.msg is not None else ast.unparse(node.test)
        c = const_value(cond) if isinstance(cond, Expr) else cond
        if isinstance(cond, Expr) and c is None:
            self.builder.emit(Assert(cond, str(msg)))
        elif not c:
            raise ParseError(f"assertion failed while building the kernel: {msg}", self.builder.span)

    def visit_Break(self, node):
        self.builder.emit(Break())

    def visit_Continue(self, node):
        self.builder.emit(Continue())

    def visit_Return(self, node):
        raise _Return(self.eval(node.value) if node.value is not None else None)

    def visit_FunctionDef(self, node):
        raise ParseError("nested function definitions are not supported in kernels; use @T.macro at module "
                         "or factory level", self.builder.span)


_AUG = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
        ast.BitOr: lambda a, b: a | b, ast.BitAnd: lambda a, b: a & b, ast.BitXor: lambda a, b: a ^ b,
        ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b}


def _deepcopy(node):
    return copy.deepcopy(node)


def _load(target):
    t = _deepcopy(target)
    for n in ast.walk(t):
        if hasattr(n, "ctx"):
            n.ctx = ast.Load()
    return t


# -- entry points -------------------------------------------------------------------------------

def parse_prim_func(fn, outer: dict | None = None) -> PrimFunc:
    """Parse ``fn`` (decorated with ``@T.prim_func``) into a :class:`PrimFunc`; ``outer`` holds the
    locals of the scope that defined it."""
    builder = Builder(fn.__name__)
    with building(builder):
        interp = Interpreter(fn, builder, outer=outer)
        builder.span = interp.span(interp.fdef)
        params = _params(interp)
        interp.layers.append({p.name: (p.buffer if p.buffer is not None else p.var) for p in params})
        try:
            interp.run_body(interp.fdef.body)
        except _Return:
            raise ParseError("a @T.prim_func does not return a value; write results into an output "
                             "tensor (and name it in out_idx)", builder.span) from None
        body = builder.pop()
    params += builder.workspace_params(p.name for p in params)
    span = Span(interp.file, interp.fdef.lineno + interp.offset, fn.__name__)
    return PrimFunc(fn.__name__, params, body, {}, span, textwrap.dedent(inspect.getsource(fn)))


def _params(interp: Interpreter) -> list:
    out = []
    args = interp.fdef.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        raise ParseError("kernel parameters must be plain positional names", interp.builder.span)
    for a in args.args:
        interp.builder.span = interp.span(a)
        if a.annotation is None:
            raise ParseError(f"parameter `{a.arg}` needs an annotation: T.Tensor(shape, dtype) or a dtype "
                             "such as T.int32", interp.builder.span)
        # Python evaluated the annotations when the kernel was defined (they may use the factory's
        # arguments, which are not in the kernel's closure); take them from there when it did.
        ann = interp.fn.__annotations__.get(a.arg)
        if ann is None or isinstance(ann, str):
            ann = interp.eval(a.annotation)
        if isinstance(ann, TensorSpec):
            buf = Buffer(a.arg, ann.shape, ann.dtype, "global")
            out.append(Param(a.arg, buffer=buf))
        elif isinstance(ann, (DType, str)):
            out.append(Param(a.arg, var=Var(a.arg, canonical(ann))))
        else:
            raise ParseError(f"parameter `{a.arg}`: annotation {ast.unparse(a.annotation)} is not "
                             "T.Tensor(shape, dtype) or a dtype", interp.builder.span)
    return out


def _check_buffer_arg(fn, name: str, spec: BufferSpec, value, span) -> None:
    what = {"shared": "T.SharedBuffer", "fragment": "T.FragmentBuffer", "local": "T.LocalBuffer"}[spec.scope]
    buf = value.buffer if isinstance(value, Region) else value
    if not isinstance(buf, Buffer):
        raise ParseError(f"macro {fn.__name__}: parameter `{name}` is a {what} but got {type(value).__name__}",
                         span)
    if buf.scope != spec.scope:
        raise ParseError(f"macro {fn.__name__}: parameter `{name}` is a {what} but {buf.name} is a "
                         f"{buf.scope} buffer", span)
    if canonical(spec.dtype) != buf.dtype:
        raise ParseError(f"macro {fn.__name__}: parameter `{name}` is {spec.dtype} but {buf.name} is {buf.dtype}",
                         span)
    shape = value.extents if isinstance(value, Region) else buf.shape
    if len(shape) != len(spec.shape) or any(
            const_value(a) is not None and const_value(as_expr(b)) is not None
            and const_value(a) != const_value(as_expr(b)) for a, b in zip(shape, spec.shape)):
        raise ParseError(f"macro {fn.__name__}: parameter `{name}` has shape {tuple(spec.shape)} but {buf.name} "
                         f"has shape {tuple(const_value(s) if const_value(s) is not None else s for s in shape)}",
                         span)


def run_macro(fn, args, kwargs):
    """Expand a ``@T.macro`` into the kernel being built; returns the macro's return value."""
    from .builder import current

    builder = current(f"macro {fn.__name__}")
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise ParseError(f"macro {fn.__name__}: {e}", builder.span) from None
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        ann = fn.__annotations__.get(name)
        if isinstance(ann, str) and "Buffer" in ann:  # under `from __future__ import annotations`
            try:
                ann = eval(ann, fn.__globals__)  # noqa: S307 - the user's own annotation
            except Exception:  # noqa: BLE001 - names a factory's locals: cannot check, as before
                ann = None
        if isinstance(ann, BufferSpec):
            _check_buffer_arg(fn, name, ann, value, builder.span)
    outer_span = builder.span
    interp = Interpreter(fn, builder, dict(bound.arguments))
    interp.layers[-1]["__tc_symbolic__"] = False
    try:
        interp.run_body(interp.fdef.body)
        result = None
    except _Return as r:
        result = r.value
    builder.span = outer_span
    return result


def parse_eager(fn, args: dict, tensor_names: list, consts: dict, symbolic: bool, given: tuple = ()):
    """Parse the body of an eager ``@tilecore.jit`` function (tilecore/language/eager.py).

    ``args`` are the compile-time arguments, ``tensor_names`` the parameters declared in the body
    (``A: T.Tensor(...)``), ``consts`` the known ``T.const`` sizes. With ``symbolic``, unknown sizes are
    symbols and parsing stops once every tensor is declared: returns the :class:`EagerState`.
    Otherwise returns ``(PrimFunc, out_idx)``; ``given`` names the sizes the caller passed by keyword,
    each of which the body must ask for with ``T.const`` (a misspelled size is an error, not ignored).
    """
    from .eager import Discovered, EagerState, Pending

    builder = Builder(fn.__name__)
    state = EagerState(consts, tensor_names, symbolic)
    builder.eager = state
    with building(builder):
        interp = Interpreter(fn, builder)
        builder.span = interp.span(interp.fdef)
        for name in inspect.signature(fn).parameters:
            builder.fresh(name)
        interp.layers.append({**args, **{n: Pending(n) for n in tensor_names}})
        try:
            for name in list(tensor_names):  # parameters annotated in the signature are declared already
                ann = fn.__annotations__.get(name)
                if isinstance(ann, (TensorSpec, DType)):
                    state.declare(interp, name, ann)
            interp.run_body(interp.fdef.body)
            returned = None
        except Discovered:
            return state
        except _Return as r:
            if len(builder.frames) != 1:
                raise ParseError("an eager kernel returns its T.empty outputs at the end of its body, not from "
                                 "inside a loop, branch or T.Kernel", builder.span) from None
            returned = r.value
        body = builder.pop()
    span = Span(interp.file, interp.fdef.lineno + interp.offset, fn.__name__)
    if state.pending:
        raise ParseError(f"argument {state.pending[0]!r} of {fn.__name__} is passed as a tensor but the body never "
                         f"declares it; add `{state.pending[0]}: T.Tensor(shape, dtype)` at the top of the body", span)
    unused = [k for k in given if k not in state.asked]
    if unused:
        asked = ", ".join(sorted(state.asked)) or "none"
        raise ParseError(f"{fn.__name__} got the size {unused[0]}={consts[unused[0]]!r}, but it is no parameter and the body "
                         f"asks for no T.const {unused[0]!r} (its T.const sizes: {asked}); check the spelling", span)
    outs = [] if returned is None else list(returned) if isinstance(returned, (tuple, list)) else [returned]
    for o in outs:
        if not any(o is x for x in state.outputs):
            raise ParseError(f"{fn.__name__} returns {o!r}; an eager kernel returns only tensors made by T.empty",
                             builder.span)
    for o in state.outputs:
        if not any(o is x for x in outs):
            raise ParseError(f"{fn.__name__}: the output {o.name!r} made by T.empty is not returned; return every "
                             "T.empty tensor (`return C` or `return C, D`)", span)
    params = [state.params[n] for n in tensor_names] + [Param(o.name, buffer=o) for o in outs]
    out_idx = list(range(len(tensor_names), len(params)))
    params += builder.workspace_params(p.name for p in params)
    source = textwrap.dedent(inspect.getsource(fn))
    return PrimFunc(fn.__name__, params, body, {}, span, source), out_idx
