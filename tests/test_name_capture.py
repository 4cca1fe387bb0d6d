"""Names a lowering or an emitter introduces never capture a user's names (issue 9).

The generated code once read the wrong rows when a user's loop variable was called ``i``, like the loop
variables tile-op lowering makes: the index simplifier told variables apart by their printed names. The
property test below gives every variable and buffer of the conformance catalog's kernels the names the
passes and emitters use themselves, and checks that the CPU results stay bit for bit the same.
"""
from __future__ import annotations

import importlib.util
import textwrap
from collections import OrderedDict

import numpy as np
import pytest

import tilecore
from tilecore.ir import Buffer, Expr, Region, Var, walk, walk_expr

#: the names tile-op lowering, thread distribution and the backends' codegen give their own loop
#: variables, temporaries and buffers (tilecore/passes, backends/*/codegen), the emitters' own ``tc_``
#: identifiers, and names the targets' spellings use; repeated so that user objects share names too
VAR_NAMES = ("i", "j", "i", "k", "r", "idx", "it", "cond", "gi", "gk", "ga", "ri", "re", "blk", "j",
             "tc_tid", "tc_it", "tc_block", "bx", "expf", "threadIdx", "NAN", "_", "i_1")
BUF_NAMES = ("acc", "s", "acc", "pipe_s", "regprog_smem", "tc_acc", "tc_status", "tc_args", "free", "A", "i")


def _collect(x, seen: OrderedDict) -> None:
    """Every Var and Buffer reachable from ``x`` (a statement field), in first-appearance order."""
    if isinstance(x, Var) or isinstance(x, Buffer):
        if id(x) not in seen:
            seen[id(x)] = x
        if isinstance(x, Buffer):
            for d in x.shape:
                _collect(d, seen)
        return
    if isinstance(x, Expr):
        walk_expr(x, lambda e: _collect(e.buffer, seen) if hasattr(e, "buffer") else
                  (_collect(e, seen) if isinstance(e, Var) else None))
    elif isinstance(x, Region):
        _collect(x.buffer, seen)
        for e in x.starts + x.extents:
            _collect(e, seen)
    elif isinstance(x, (tuple, list)):
        for y in x:
            _collect(y, seen)
    elif isinstance(x, dict):
        for y in x.values():
            _collect(y, seen)


def rename_everything(func):
    """Rename, in place, every variable and buffer of a parsed kernel to the lowerings' own names."""
    seen: OrderedDict = OrderedDict()
    for p in func.params:
        _collect(p.buffer if p.buffer is not None else p.var, seen)
    walk(func.body, lambda s: [_collect(getattr(s, f), seen) for f in s.__dataclass_fields__ if f != "span"])
    # a tensor's symbolic dimensions are bound by name at call time (the kernel's signature), so two of them
    # keep distinct names; every other name may repeat
    shape_syms: set = set()
    for p in func.params:
        if p.buffer is not None:
            for d in p.buffer.shape:
                walk_expr(d, lambda e: shape_syms.add(id(e)) if isinstance(e, Var) else None)
    nv = nb = 0
    taken: set = set()
    for obj in seen.values():
        if isinstance(obj, Var):
            name, nv = VAR_NAMES[nv % len(VAR_NAMES)], nv + 1
            if id(obj) in shape_syms:
                while name in taken:
                    name, nv = VAR_NAMES[nv % len(VAR_NAMES)], nv + 1
                taken.add(name)
            obj.name = name
        else:
            obj.name, nb = BUF_NAMES[nb % len(BUF_NAMES)], nb + 1
    return func


def _catalog_sample() -> list:
    """The first case of each family and first parameter that the CPU can run (about 40 of the catalog)."""
    from tilecore_conformance.catalog import TORCH_ONLY, catalog

    from tilecore.plugin import get_registry, profile_for

    caps = profile_for(get_registry().resolve("cpu")[1])
    picked: OrderedDict = OrderedDict()
    for case in catalog():
        if any(d in case.id for d in TORCH_ONLY) or not all(caps.satisfies(n)[0] for n in case.needs):
            continue  # torch-only dtypes (the test feeds numpy arrays); capabilities the CPU lacks
        picked.setdefault("/".join(case.id.split("/")[:2]), case)
    return list(picked.values())


def _run(case, func):
    from tilecore_conformance.runner import _poison

    kernel = tilecore.compile(func, target="cpu", pass_configs=case.pass_configs or None)
    inputs = case.inputs(np.random.default_rng(case.seed), **case.params)
    refs = case.reference(inputs, **case.params)
    inputs = [np.array(x) for x in inputs]
    if case.out_idx == ():
        kernel(*inputs)
        return [inputs[-1]]
    outs = [_poison(r.shape, case.out_dtype) for r in refs]
    kernel(*inputs, *outs)
    return outs


@pytest.mark.parametrize("case", _catalog_sample(), ids=lambda c: c.id)
def test_catalog_kernels_give_the_same_results_under_the_lowerings_names(case):
    plain = _run(case, case.build(**case.params))
    renamed_func = rename_everything(case.build(**case.params))
    assert "i" in renamed_func.script()  # the renaming took
    renamed = _run(case, renamed_func)
    for a, b in zip(plain, renamed):
        np.testing.assert_array_equal(a, b)  # bit for bit; NaN where NaN


def test_renaming_reaches_every_user_object():
    from tilecore_conformance.catalog import catalog

    case = next(c for c in catalog() if c.id.startswith("attention/causal/float32"))
    func = rename_everything(case.build(**case.params))
    seen: OrderedDict = OrderedDict()
    walk(func.body, lambda s: [_collect(getattr(s, f), seen) for f in s.__dataclass_fields__ if f != "span"])
    names = {o.name for o in seen.values()}
    assert names <= set(VAR_NAMES) | set(BUF_NAMES)
    assert len(seen) > len(names)  # several objects share a name


def _kernel_from_source(tmp_path, loop_var: str):
    src = textwrap.dedent(f"""
        import tilecore.language as T

        @T.prim_func
        def main(A: T.Tensor((8, 16), "float32"), B: T.Tensor((8, 16), "float32")):
            with T.Kernel(1) as bx:
                s = T.alloc_shared((4, 16), "float32")
                for {loop_var} in T.serial(2):
                    T.copy(A[{loop_var} * 4:({loop_var} + 1) * 4, :], s)
                    T.copy(s, B[{loop_var} * 4:({loop_var} + 1) * 4, :])
    """)
    path = tmp_path / f"k_{loop_var}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"k_{loop_var}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize("target", ["cpu", "webgpu"])
@pytest.mark.parametrize("loop_var", ["t", "i", "j", "tc_tid", "idx"])
def test_issue9_copy_region_with_a_loop_variable_named_i(tmp_path, target, loop_var):
    """The issue's repro: with the loop variable named ``i`` the copy read rows 0..3 and 5..8."""
    kernel = tilecore.compile(_kernel_from_source(tmp_path, loop_var), target=target, out_idx=[-1])
    a = np.arange(128, dtype=np.float32).reshape(8, 16)
    if target == "webgpu":  # lavapipe here (tests/test_webgpu_backend.py needs it too)
        import torch

        b = kernel(torch.from_numpy(a)).cpu().numpy()
    else:
        kernel2 = tilecore.compile(_kernel_from_source(tmp_path, loop_var), target=target)
        b = np.full_like(a, np.nan)  # a fresh, poisoned output: nothing left over from another run
        kernel2(a, b)
        np.testing.assert_array_equal(kernel(a), a)
    np.testing.assert_array_equal(b, a)
