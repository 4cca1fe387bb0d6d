"""Result states, cases and tolerances of the conformance suite."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

# Result states (DESIGN.md, "Conformance result model")
PASS = "PASS"
FAIL = "FAIL"
NOT_SUPPORTED = "NOT_SUPPORTED"
EXPECTED_FAIL = "EXPECTED_FAIL"
UNEXPECTED_PASS = "UNEXPECTED_PASS"
CRASH = "CRASH"
TIMEOUT = "TIMEOUT"
HARNESS_ERROR = "HARNESS_ERROR"
STATES = (PASS, FAIL, NOT_SUPPORTED, EXPECTED_FAIL, UNEXPECTED_PASS, CRASH, TIMEOUT, HARNESS_ERROR)
#: states that fail a run
FAILING = (FAIL, UNEXPECTED_PASS, CRASH, TIMEOUT, HARNESS_ERROR)
#: worst first: the order of a failures-first view
SEVERITY = (HARNESS_ERROR, CRASH, TIMEOUT, FAIL, UNEXPECTED_PASS, EXPECTED_FAIL, NOT_SUPPORTED, PASS)
#: how a state reads in JUnit XML (PASS: a plain test case)
JUNIT = {FAIL: "failure", UNEXPECTED_PASS: "failure", CRASH: "error", TIMEOUT: "error", HARNESS_ERROR: "error",
         NOT_SUPPORTED: "skipped", EXPECTED_FAIL: "skipped"}

MODES = ("device", "emulated", "compile-only", "codegen-only")


@dataclass(frozen=True)
class Case:
    """One conformance case.

    ``build(**params)`` returns a ``@T.prim_func``; ``inputs(rng, **params)`` the host inputs (numpy
    arrays, or torch tensors for dtypes numpy lacks); ``reference(inputs, **params)`` the expected
    outputs in float64 numpy. ``needs`` are capability need strings checked before the case runs.
    """

    id: str
    family: str
    params: dict
    needs: tuple
    build: Callable
    inputs: Callable
    reference: Callable
    out_idx: tuple = (-1,)
    op_class: str = "elementwise"  # data | elementwise | reduction | matmul
    reduce_len: int = 1
    out_dtype: str = "float32"
    acc_dtype: str = "float32"
    pass_configs: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.id.encode()).digest()[:4], "little")


@dataclass
class Result:
    id: str
    family: str
    params: dict
    state: str
    mode: str
    target: str
    seed: int
    duration: float = 0.0
    error: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# Tolerances: (rtol, atol) per output dtype for elementwise work: torch.testing's defaults.
ELEMENTWISE = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
               "float64": (1e-7, 1e-7), "float8_e4m3": (1.25e-1, 1e-3), "float8_e5m2": (2.5e-1, 1e-3)}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def tolerance(case: Case, ref_scale: float) -> tuple:
    """``(rtol, atol)`` for a case: data movement is bit-exact; reductions and matrix products get
    an absolute slack that grows with the reduction length and the accumulator's epsilon."""
    if case.op_class == "data":
        return 0.0, 0.0
    rtol, atol = ELEMENTWISE.get(case.out_dtype, (0.0, 0.0))
    if case.out_dtype not in ELEMENTWISE:  # integers: exact
        return 0.0, 0.0
    if case.op_class in ("reduction", "matmul"):
        eps = EPS.get(case.acc_dtype, 2.0 ** -23)
        atol = max(atol, 4.0 * case.reduce_len * eps * ref_scale)
        rtol = max(rtol, 4.0 * eps)
    return rtol, atol
