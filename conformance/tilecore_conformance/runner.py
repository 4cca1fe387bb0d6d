"""Run one case on one target and decide its state."""
from __future__ import annotations

import time
import traceback

import numpy as np

import tilecore
from tilecore.errors import TilecoreError, UnsupportedFeatureError

from .catalog import TORCH_ONLY, f64
from .model import (CRASH, EXPECTED_FAIL, FAIL, HARNESS_ERROR, NOT_SUPPORTED, PASS, UNEXPECTED_PASS, Case, Result,
                    tolerance)


class Target:
    """Everything about the target under test, resolved once per session."""

    def __init__(self, spec: str):
        from tilecore.plugin import profile_for, resolve_target

        self.backend, self.target = resolve_target(spec)
        self.caps = profile_for(self.target)
        self.probe = self.backend.probe()  # a failure here is a HARNESS_ERROR of the session, never a skip
        from tilecore.capabilities import compare_probe

        mode = self.backend.runtime(self.target).mode()
        if mode in ("device", "emulated") and self.probe.status != "ok":
            mode = "compile-only"  # nothing to run on: the best honest mode is compiling
        self.mode = mode
        # declared values that the live device contradicts fail the run (never a silent skip); where the
        # device here cannot run this target (runtime says compile-only although a device answered, e.g.
        # an sm_80 profile on an sm_90 GPU), the probe describes another device and is not compared
        describes_target = mode in ("device", "emulated") or self.probe.status != "ok"
        self.mismatches = (compare_probe(self.caps, self.probe.capabilities)
                           if self.probe.capabilities and describes_target else [])
        self.name = str(self.target)
        #: where the runtime wants its tensors ("cpu" or a torch device type such as a GPU's); the
        #: catalog builds inputs on the host, and the runner moves them there and the outputs back
        self.tensor_device = getattr(self.backend.runtime(self.target), "tensor_device", "cpu")


def _to_device(x, device: str):
    """A host array (numpy or CPU torch) as a torch tensor on the runtime's device; other values as is."""
    if device == "cpu":
        return x
    import torch

    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, torch.Tensor):
        return x.to(device)
    return x


def _to_host(x):
    if isinstance(x, np.ndarray):
        return x
    try:
        import torch
    except ImportError:  # pragma: no cover - a non-numpy output implies torch
        return x
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _poison(shape, dtype):
    if dtype in ("bfloat16", "float8_e4m3", "float8_e5m2"):
        import torch

        name = {"float8_e4m3": "float8_e4m3fn"}.get(dtype, dtype)
        return torch.full(shape, float("nan"), dtype=getattr(torch, name))
    if dtype == "bool":
        return np.zeros(shape, np.bool_)
    if dtype.startswith(("int", "uint")):
        return np.full(shape, np.iinfo(dtype).max, dtype)
    return np.full(shape, np.nan, dtype)


def new_result(case: Case, t) -> Result:
    """A case's result record before it ran (FAIL until decided)."""
    return Result(case.id, case.family, _jsonable(case.params), FAIL, t.mode, t.name, case.seed)


def run_case(case: Case, t: Target, expected_fail: dict | None = None) -> Result:
    """Run one case in this process. A Python exception is a CRASH; a native crash or a hang takes the
    process with it: the conformance run calls this in a child process (``isolation.py``)."""
    start = time.perf_counter()
    res = new_result(case, t)
    try:
        _run(case, t, res)
    except Exception as e:  # noqa: BLE001 - anything unexpected is a crash of the case, reported
        if isinstance(e, ModuleNotFoundError) and e.name == "torch":
            # the harness cannot build this case's inputs here: not the target's fault, so not CRASH, and
            # not NOT_SUPPORTED either (that needs the capability explicitly absent; the target may have it)
            dtype = next((d + " " for d in TORCH_ONLY if d in case.id.split("/")), "")
            res.state, res.error = HARNESS_ERROR, f"needs torch for {dtype}inputs: pip install torch"
        else:
            res.state, res.error = CRASH, "".join(traceback.format_exception_only(type(e), e)).strip()
    res.duration = round(time.perf_counter() - start, 4)
    return apply_expectations(res, expected_fail)


def apply_expectations(res: Result, expected_fail: dict | None) -> Result:
    """FAIL of a case the expectations file lists -> EXPECTED_FAIL; PASS of one -> UNEXPECTED_PASS."""
    if expected_fail and res.id in expected_fail:
        if res.state == FAIL:
            res.state, res.error = EXPECTED_FAIL, f"{res.error} (expected: {expected_fail[res.id]})"
        elif res.state == PASS:
            res.state, res.error = UNEXPECTED_PASS, f"passes, but expectations say: {expected_fail[res.id]}"
    return res


def _limit_name(need: str) -> str:
    """``limit:name>=value`` -> ``limit:name``: a backend refuses a kernel for the limit, not the value."""
    if not need.startswith("limit:"):
        return need
    return "limit:" + need[6:].split(">")[0].split("<")[0].split("=")[0].split("!")[0].strip()


def _run(case: Case, t: Target, res: Result) -> None:
    absent = [need for need in case.needs if t.caps.satisfies(need)[0] is False]
    func = case.build(**case.params)
    configs = {"tilecore.disable_cache": False, **case.pass_configs}
    if absent:
        try:
            tilecore.compile(func, target=t.target, pass_configs=configs)
        except UnsupportedFeatureError as e:
            if e.feature in absent or e.feature in {_limit_name(n) for n in absent}:
                res.state, res.error = NOT_SUPPORTED, str(e)
            else:
                res.state, res.error = FAIL, f"refused for {e.feature}, but the case lacks {absent}: {e}"
            return
        except TilecoreError as e:
            res.state, res.error = FAIL, f"{absent} absent, expected UnsupportedFeatureError, got {type(e).__name__}: {e}"
            return
        res.state, res.error = FAIL, f"compiled although {', '.join(absent)} is absent (a silent fallback)"
        return
    try:
        kernel = tilecore.compile(func, target=t.target, pass_configs=configs)
    except UnsupportedFeatureError as e:
        # a limit the target declares, exceeded by how its backend lays the kernel out (e.g. fragments in
        # block memory): the target explicitly cannot run this kernel
        declared = e.feature.startswith("limit:") and t.caps.limit(e.feature[6:]) is not None
        res.state, res.error = (NOT_SUPPORTED, str(e)) if declared else (FAIL, f"compile failed: {e}")
        return
    except TilecoreError as e:
        res.state, res.error = FAIL, f"compile failed: {e}"
        return
    if t.mode in ("compile-only", "codegen-only"):
        res.state = PASS
        return
    rng = np.random.default_rng(case.seed)
    inputs = case.inputs(rng, **case.params)
    refs = case.reference(inputs, **case.params)
    args = [_to_device(x, t.tensor_device) for x in inputs]
    if case.out_idx == ():  # updated in place: the last input is the output
        kernel(*args)
        outs = [_to_host(args[-1])]
    else:
        outs = [_to_device(_poison(r.shape, case.out_dtype), t.tensor_device) for r in refs]
        kernel(*args, *outs)
        outs = [_to_host(o) for o in outs]
    worst_abs, worst_rel, problems = 0.0, 0.0, []
    for k, (o, r) in enumerate(zip(outs, refs)):
        got = f64(o)
        if got.shape != r.shape:
            problems.append(f"output {k}: shape {got.shape}, expected {r.shape}")
            continue
        scale = float(np.max(np.abs(r[np.isfinite(r)]))) if np.isfinite(r).any() else 1.0
        rtol, atol = tolerance(case, max(scale, 1.0))
        finite = np.isfinite(r)
        if (np.isnan(got) & ~np.isnan(r)).any():
            problems.append(f"output {k}: {int((np.isnan(got) & ~np.isnan(r)).sum())} element(s) not written or NaN")
        g, want = got[~finite], r[~finite]
        if ((g != want) & ~(np.isnan(g) & np.isnan(want))).any():
            problems.append(f"output {k}: infinities or NaN differ (a NaN expected where the result has none)")
        diff = np.abs(got - r)[finite & ~np.isnan(got)]
        if diff.size:
            worst_abs = max(worst_abs, float(diff.max()))
            rel = diff / np.maximum(np.abs(r[finite & ~np.isnan(got)]), 1e-30)
            worst_rel = max(worst_rel, float(rel.max()))
            bad = diff > atol + rtol * np.abs(r[finite & ~np.isnan(got)])
            if bad.any():
                problems.append(f"output {k}: {int(bad.sum())} of {bad.size} elements outside rtol={rtol:.3g} "
                                f"atol={atol:.3g} (worst abs error {float(diff.max()):.3g})")
    res.max_abs_err, res.max_rel_err = worst_abs, worst_rel
    res.state, res.error = (FAIL, "; ".join(problems)) if problems else (PASS, "")


def _jsonable(params: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()}
