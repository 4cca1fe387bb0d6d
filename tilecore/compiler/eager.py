"""Eager-style ``@tilecore.jit``: the decorated function's body is the kernel (see tilecore/language/eager.py).

    c = add(a, b, block=128)           # binds the T.const sizes from a and b, compiles once per sizes, runs
    k = add.compile(N=4096, block=128) # a JITKernel for given sizes: k(a, b) returns the T.empty outputs

The arguments that are tensors (numpy, torch, a backend's device tensors) are the kernel's inputs; every
other argument is a compile-time value, as in a kernel factory. Arguments not passed to ``.compile`` and
without a default are tensors too, declared in the body. Keywords that name no parameter give
``T.const`` sizes.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import threading

from ..errors import ArgumentError, CompileError
from .binding import _is_numpy, _is_torch, device_buffer


def is_eager(fn) -> bool:
    """True when ``fn``'s own body builds a kernel (``with T.Kernel``, ``T.const``, ``T.empty``) instead of
    returning a ``@T.prim_func`` it defines."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    todo = list(fdef.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # a kernel defined inside: a factory
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("const", "empty",
                                                                                                      "Kernel"):
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def _is_tensor(v) -> bool:
    return _is_torch(v) or _is_numpy(v) or device_buffer(v) is not None


def _shape(v) -> tuple:
    d = device_buffer(v)
    return tuple(d["shape"]) if d is not None else tuple(v.shape)


def _key(values: dict) -> tuple:
    return tuple((k, repr(v)) for k, v in values.items())


class EagerJit:
    """What ``@tilecore.jit`` returns for an eager kernel."""

    def __init__(self, fn, target="auto", pass_configs=None):
        self.fn = fn
        self.target = target
        self.pass_configs = pass_configs
        self.signature = inspect.signature(fn)
        for p in self.signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
                raise CompileError(f"eager kernel {fn.__name__}: parameter {p.name!r} must be a plain named parameter "
                                   "(no *args, **kwargs or positional-only)")
        self._templates: dict = {}
        self._kernels: dict = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    # -- arguments ----------------------------------------------------------------------------------
    def _split(self, args, kwargs):
        """``(compile_args, tensors, consts)``: tensors maps names to values (None when not passed)."""
        params = self.signature.parameters
        consts = {k: kwargs[k] for k in kwargs if k not in params}
        try:
            bound = self.signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
        except TypeError as e:
            raise ArgumentError(f"{self.fn.__name__}: {e}") from None
        compile_args, tensors = {}, {}
        for name, p in params.items():
            if name in bound.arguments:
                v = bound.arguments[name]
                (tensors if _is_tensor(v) else compile_args)[name] = v
            elif p.default is not p.empty:
                compile_args[name] = p.default
            else:
                tensors[name] = None
        for k, v in consts.items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise ArgumentError(f"{self.fn.__name__}: {k}={v!r} names no parameter, so it is a T.const size and "
                                    "must be an int")
        return compile_args, tensors, consts

    def _template(self, compile_args, names, consts):
        from ..language.parser import parse_eager

        key = (_key(compile_args), tuple(names), tuple(sorted(consts.items())))
        t = self._templates.get(key)
        if t is None:
            state = parse_eager(self.fn, compile_args, names, consts, symbolic=True)
            t = {n: list(state.specs[n].shape) for n in state.specs} if not isinstance(state, tuple) else {}
            self._templates[key] = t
        return t

    def _solve(self, template, tensors, consts) -> dict:
        """The T.const sizes the tensors' shapes determine, added to ``consts``."""
        from ..ir import Var

        sizes = dict(consts)
        source: dict = {}
        for name, value in tensors.items():
            if value is None or name not in template:
                continue
            dims, shape = template[name], _shape(value)
            if len(dims) != len(shape):
                raise ArgumentError(f"{self.fn.__name__}: argument {name!r} has shape {shape}, but the body declares "
                                    f"{len(dims)} dimensions")
            for i, (d, have) in enumerate(zip(dims, shape)):
                if not isinstance(d, Var):
                    continue  # a number or an expression: checked when the kernel binds its arguments
                prev = sizes.setdefault(d.name, int(have))
                source.setdefault(d.name, (name, i))
                if prev != have:
                    where = source[d.name]
                    got = f"from argument {where[0]!r} dim {where[1]}" if where != (name, i) else "as given"
                    raise ArgumentError(f"{self.fn.__name__}: argument {name!r} dim {i} is {have}, but {d.name!r} is "
                                        f"{prev} {got}")
        return sizes

    # -- compiling ----------------------------------------------------------------------------------
    def _kernel(self, args, kwargs):
        compile_args, tensors, consts = self._split(args, dict(kwargs))
        names = list(tensors)
        sizes = self._solve(self._template(compile_args, names, consts), tensors, consts)
        key = (_key(compile_args), tuple(names), tuple(sorted(sizes.items())))
        with self._lock:
            k = self._kernels.get(key)
        if k is None:
            from . import compile as compile_func

            func, out_idx = self._parse(compile_args, names, sizes, consts)
            k = compile_func(func, target=self.target, out_idx=out_idx, pass_configs=self.pass_configs)
            with self._lock:
                self._kernels[key] = k
        return k, names, tensors

    def _parse(self, compile_args, names, sizes, given):
        from ..language.parser import parse_eager

        func, out_idx = parse_eager(self.fn, compile_args, names, sizes, symbolic=False, given=tuple(given))
        return func, out_idx

    def compile(self, *args, **kwargs):
        """Compile for the given compile-time arguments and sizes (``M=...``) or example tensors."""
        return self._kernel(args, kwargs)[0]

    def get_tir(self, *args, **kwargs):
        compile_args, tensors, consts = self._split(args, dict(kwargs))
        names = list(tensors)
        sizes = self._solve(self._template(compile_args, names, consts), tensors, consts)
        return self._parse(compile_args, names, sizes, consts)[0]

    def __call__(self, *args, **kwargs):
        kernel, names, tensors = self._kernel(args, kwargs)
        missing = [n for n in names if tensors[n] is None]
        if missing:
            raise ArgumentError(f"{self.fn.__name__}: missing tensor argument {missing[0]!r}; pass it, or use "
                                f"{self.fn.__name__}.compile(...) to get a kernel without running it")
        return kernel(*(tensors[n] for n in names))
