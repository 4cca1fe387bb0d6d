"""The process that imports apache-tvm: bridged programs in, TVM's device code out.

Run as ``python -m tilecore_tvm.worker``; it reads one JSON request per line on stdin and writes one
JSON reply per line on stdout. LLVM errors inside this wheel abort the process (no Python exception),
so compiles never run in the user's process: ``runtime.py`` starts this worker once per process,
sends it every compile, and starts a fresh one if it dies (the request then fails with a CompileError
naming the abort). A request: ``{"program": <bridge.py's dict>, "target": {"kind": ..., "mcpu": ...}}``;
a reply: ``{"ok": true, "source": text, "binary": base64 or null, "tir": TVMScript}`` or
``{"ok": false, "error": text}``.

Workarounds for apache-tvm 0.27.0.post1 (each has a regression test in tests/test_tvm_backend.py):

- the pipeline is our own (``PIPELINE``): the default one references ``LowerInitBlock``, which is gone
  from ``tvm.tirx.transform``, and its ThreadSync pass rejects barriers inside conditions (tilecore
  places its own barriers, so TVM's are not needed);
- ROCm: no ROCm install is needed: the device libraries come from Debian's ``rocm-device-libs``
  (without ``ockl``, whose ``noinline``/``alwaysinline`` attributes fail LLVM's verifier) and the code
  object is linked with ``ld.lld`` found on PATH; the linked bytes are kept as the binary.
"""
from __future__ import annotations

import base64
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("TVM_DEVICE_BACKEND_AUTOLOAD", "0")

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm import ir, tirx  # noqa: E402

#: ROCm device-library folders, Debian's first (``rocm-device-libs``), then a ROCm install's
BITCODE_DIRS = ("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/amdgcn/bitcode", "/opt/rocm/amdgcn/bitcode")
BITCODE = ("ocml", "oclc_daz_opt_off", "oclc_correctly_rounded_sqrt_on", "oclc_finite_only_off",
           "oclc_unsafe_math_off", "oclc_abi_version_500")
_last_code_object: list = []
_link_math = [True]
#: float64 math that goes to ROCm's device library by name on rocm targets
OCML_F64 = ("exp", "exp2", "exp10", "log", "log2", "log10", "tanh", "sin", "cos", "tan", "erf", "pow")


def _bitcode_path(rocdl_dir=None):
    if not _link_math:  # linking ocml costs ~40 ms a kernel: only kernels that call math functions get it
        return []
    for d in ([rocdl_dir] if rocdl_dir else []) + list(BITCODE_DIRS):
        if d and os.path.exists(os.path.join(d, "ocml.bc")):
            names = list(BITCODE) + ["oclc_wavefrontsize64_on"]
            return [os.path.join(d, n + ".bc") for n in names if os.path.exists(os.path.join(d, n + ".bc"))]
    return []


def find_lld() -> str:
    for name in ["ld.lld", *(f"ld.lld-{v}" for v in range(30, 14, -1))]:
        path = shutil.which(name)
        if path:
            return path
    return ""


def _link(obj):
    lld = find_lld()
    if not lld:
        raise RuntimeError("no ld.lld on PATH to link the AMDGPU code object (apt-get install lld)")
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "k.o"), os.path.join(d, "k.co")
        with open(src, "wb") as f:
            f.write(bytes(obj))
        r = subprocess.run([lld, "--no-undefined", "-shared", src, "-o", out], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError("ld.lld failed: " + r.stdout + r.stderr)
        data = open(out, "rb").read()
    _last_code_object[:] = [data]
    return bytearray(data)


tvm_ffi.register_global_func("tvm_callback_rocm_bitcode_path", _bitcode_path, override=True)
tvm_ffi.register_global_func("tvm_callback_rocm_link", _link, override=True)


def _pipeline_passes():
    t = tirx.transform
    return [t.StmtSimplify(), t.UnrollLoop(), t.StmtSimplify(), t.RemoveNoOp(), t.VerifyMemory(),
            t.AnnotateEntryFunc(), t.SplitHostDevice(), t.MakePackedAPI()]


def _tilecore_pipeline():
    @tvm.transform.module_pass(opt_level=0, name="tilecore_tvm.pipeline")
    def _pipe(mod, _ctx):
        return tvm.ir.transform.Sequential(_pipeline_passes())(mod)

    from tvm.tirx.compilation_pipeline import finalize_device_passes, finalize_host_passes

    return _pipe, finalize_host_passes, finalize_device_passes


tirx.register_tir_pipeline("tilecore", _tilecore_pipeline)
PIPELINE = "tilecore"

_BIN = {"add": tirx.Add, "sub": tirx.Sub, "mul": tirx.Mul, "floordiv": tirx.FloorDiv, "floormod": tirx.FloorMod,
        "min": tirx.Min, "max": tirx.Max, "shl": tirx.LShift,
        "shr": tirx.RShift, "xor": tirx.BitwiseXor, "bitand": tirx.BitwiseAnd, "bitor": tirx.BitwiseOr}
_CMP = {"lt": tirx.LT, "le": tirx.LE, "gt": tirx.GT, "ge": tirx.GE, "eq": tirx.EQ, "ne": tirx.NE}


class Builder:
    def __init__(self, prog: dict, target: dict, ocml: bool = True):
        self.prog, self.target, self.ocml = prog, target, ocml
        self.vars = [tirx.Var(name, dtype) for name, dtype in prog["vars"]]
        self.bufs = []
        for b in prog["buffers"]:
            if b.get("scope") == "global":
                shape = [self.expr(x) for x in b["shape"]]
                numel = shape[0]
                for x in shape[1:]:
                    numel = numel * x
                self.bufs.append(tirx.decl_buffer((numel,), b["dtype"], b["name"]))
            else:
                self.bufs.append(tirx.decl_buffer((self.expr(b["numel"]),), b["dtype"], b["name"],
                                                  scope=b["scope"] or "local"))
        self.tid = tirx.Var("tc_tid", "int32")

    # -- expressions ------------------------------------------------------------------------------
    def const(self, v, dtype):
        """A float constant; infinities and NaN by their bits, because TVM 0.27's WGSL generator prints
        them as ``inff`` / ``nanf``, which are not WGSL (the shader compiler rejects ``-inff``)."""
        if isinstance(v, str):
            v = float(v)
        if math.isfinite(v):
            return tirx.const(v, dtype)
        if dtype == "float16":  # WGSL has no 16-bit integer to reinterpret: the float32 value, narrowed
            return tirx.Cast("float16", self.const(v, "float32"))
        bits = {"float16": ("uint16", "<e", "<H"), "float32": ("uint32", "<f", "<I"), "float64": ("uint64", "<d", "<Q")}
        ut, ff, uf = bits[dtype]
        return tirx.reinterpret(dtype, tirx.const(struct.unpack(uf, struct.pack(ff, v))[0], ut))

    def expr(self, e):
        tag = e[0]
        if tag == "v":
            return self.vars[e[1]]
        if tag == "i":
            return tirx.const(e[1], e[2])
        if tag == "f":
            return self.const(e[1], e[2])
        if tag == "tid":
            return self.tid
        if tag == "b":
            a, b, dtype = self.expr(e[2]), self.expr(e[3]), e[4]
            op = e[1]
            if op == "div":
                return tirx.Div(a, b) if dtype.startswith("float") else tirx.truncdiv(a, b)
            if op in ("min", "max") and dtype.startswith("float"):
                # NaN in either operand gives NaN, as on every tilecore target (TIR's min/max do not say)
                m = (tirx.Min if op == "min" else tirx.Max)(a, b)
                return tirx.Select(tirx.Or(tirx.isnan(a), tirx.isnan(b)), self.const(math.nan, dtype), m)
            return _BIN[op](a, b)
        if tag == "c":
            return _CMP[e[1]](self.expr(e[2]), self.expr(e[3]))
        if tag == "and":
            return tirx.And(self.expr(e[1]), self.expr(e[2]))
        if tag == "or":
            return tirx.Or(self.expr(e[1]), self.expr(e[2]))
        if tag == "not":
            return tirx.Not(self.expr(e[1]))
        if tag == "sel":
            return tirx.Select(self.expr(e[1]), self.expr(e[2]), self.expr(e[3]))
        if tag == "cast":
            v = self.expr(e[2])
            if e[1] == "bool":
                return tirx.NE(v, tirx.const(0, v.dtype))
            return tirx.Cast(e[1], v)
        if tag == "call":
            args = [self.expr(a) for a in e[2]]
            name = e[1]
            if name == "abs":
                return tirx.abs(args[0])
            if self.target["kind"] == "rocm" and e[3] == "float64" and name in OCML_F64 and self.ocml:
                # TVM lowers float64 math to LLVM intrinsics the AMDGPU backend cannot select ("no libcall
                # available for fexp": an LLVM abort); the device library has them
                return tirx.call_pure_extern("float64", f"__ocml_{name}_f64", *args)
            if name == "pow":
                return tirx.pow(args[0], args[1])
            return getattr(tirx, name)(*args)
        if tag == "ld":
            return tirx.BufferLoad(self.bufs[e[1]], [self.expr(e[2])])
        if tag == "bf16_in":  # bfloat16 bits (uint16) -> float32
            bits = tirx.Cast("uint32", self.expr(e[1]))
            return tirx.reinterpret("float32", tirx.LShift(bits, tirx.const(16, "uint32")))
        if tag == "bf16_out":  # float32 -> bfloat16 bits, rounded to nearest even (NaN kept quiet)
            v = self.expr(e[1])
            bits = tirx.reinterpret("uint32", v)
            lsb = tirx.BitwiseAnd(tirx.RShift(bits, tirx.const(16, "uint32")), tirx.const(1, "uint32"))
            rounded = tirx.RShift(bits + tirx.const(0x7FFF, "uint32") + lsb, tirx.const(16, "uint32"))
            quiet = tirx.BitwiseOr(tirx.RShift(bits, tirx.const(16, "uint32")), tirx.const(0x40, "uint32"))
            return tirx.Cast("uint16", tirx.Select(tirx.isnan(v), quiet, rounded))
        raise ValueError(f"unknown expression tag {tag!r}")

    # -- statements -------------------------------------------------------------------------------
    def stmt(self, s) -> list:
        tag = s[0]
        if tag == "seq":
            out = []
            for x in s[1]:
                out.extend(self.stmt(x))
            return out
        if tag == "for":
            kind = tirx.ForKind.UNROLLED if s[4] == "unroll" else tirx.ForKind.SERIAL
            return [tirx.For(self.vars[s[1]], self.expr(s[2]), self.expr(s[3]), kind, self.block(s[5]))]
        if tag == "if":
            return [tirx.IfThenElse(self.expr(s[1]), self.block(s[2]), None if s[3] is None else self.block(s[3]))]
        if tag == "st":
            return [tirx.BufferStore(self.bufs[s[1]], self.expr(s[3]), [self.expr(s[2])])]
        if tag == "let":
            return [tirx.Bind(self.vars[s[1]], self.expr(s[2]))]
        if tag == "alloc":
            return [tirx.AllocBuffer(self.bufs[s[1]])]
        if tag == "sync":
            return [tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))]
        if tag == "break":
            return [tirx.Break()]
        if tag == "continue":
            return [tirx.Continue()]
        raise ValueError(f"unknown statement tag {tag!r}")

    def block(self, s):
        out = self.stmt(s)
        if not out:
            return tirx.Evaluate(tirx.const(0, "int32"))
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)

    def func(self):
        prog = self.prog
        body = self.stmt(prog["body"])
        # the flat thread index is threadIdx.x; the grid dimensions are blockIdx.x/y/z
        inner = tirx.SeqStmt(body) if len(body) != 1 else body[0]
        inner = tirx.AttrStmt(tirx.IterVar(ir.Range(0, prog["threads"]), self.tid, 1, "threadIdx.x"),
                              "thread_extent", prog["threads"], inner)
        for k in reversed(range(len(prog["grid"]))):
            v = self.vars[prog["block_vars"][k]]
            inner = tirx.AttrStmt(tirx.IterVar(None, v, 1, "blockIdx." + "xyz"[k]), "thread_extent",
                                  self.expr(prog["grid"][k]), inner)
        params = [self.bufs[p[1]] if p[0] == "buf" else self.vars[p[1]] for p in prog["params"]]
        return tirx.PrimFunc(params, inner).with_attr({"global_symbol": prog["name"], "tirx.noalias": True})


def prove(req: dict) -> dict:
    """TVM's analyzer as the tests' oracle, over bridged integer expressions (``req["vars"]`` as a program's).

    Each query is ``{"kind": "eq", "a": .., "b": ..}`` (can TVM prove ``a == b`` for every value?) or
    ``{"kind": "holds", "cond": .., "facts": [g, ...], "conds": [c, ...]}`` (under ``g >= 0`` for each fact
    and each boolean ``c``, e.g. ``n % 8 == 0``: can TVM prove ``cond``, and can it prove ``not cond``, i.e.
    refute it?). A query TVM cannot build gives ``None``."""
    import contextlib

    b = Builder({"vars": req["vars"], "buffers": []}, {"kind": "none"})
    out = []
    for q in req["queries"]:
        try:
            ana = tvm.sym.Analyzer()
            if q["kind"] == "eq":
                out.append([bool(ana.can_prove(tirx.EQ(b.expr(q["a"]), b.expr(q["b"])))), False])
                continue
            with contextlib.ExitStack() as stack:
                for g in q["facts"]:
                    stack.enter_context(ana.constraint_scope(tirx.GE(b.expr(g), tirx.const(0, "int32"))))
                for c in q.get("conds", ()):
                    stack.enter_context(ana.constraint_scope(b.expr(c)))
                cond = b.expr(q["cond"])
                out.append([bool(ana.can_prove(cond)), bool(ana.can_prove(tirx.Not(cond)))])
        except Exception:  # noqa: BLE001 - mixed dtypes and the like: the query is not answered
            out.append(None)
    return {"ok": True, "answers": out}


def compile_program(req: dict) -> dict:
    if req.get("op") == "prove":
        return prove(req)
    target = tvm.target.Target(req["target"])
    func = Builder(req["program"], req["target"], ocml=req.get("ocml_f64", True)).func()
    tir = func.script() if req.get("want_tir") else ""
    _last_code_object.clear()
    _link_math[:] = [True] if '["call",' in json.dumps(req["program"]) else []
    # "pipeline" lets the regression tests run TVM's own pipeline on a bridged kernel
    ex = tvm.compile(func, target=target, tir_pipeline=req.get("pipeline", PIPELINE))
    dev = ex.mod.imports[0]
    kind = req["target"]["kind"]
    if kind == "rocm":
        source = dev.inspect_source("asm")
        if not _last_code_object:
            raise RuntimeError("TVM produced no AMDGPU code object")
        binary = base64.b64encode(_last_code_object[0]).decode()
    else:
        source, binary = dev.inspect_source(), None
    return {"ok": True, "source": source, "binary": binary, "tir": tir}


def serve(inp=sys.stdin, out=sys.stdout) -> None:
    out.write(json.dumps({"ready": True, "tvm": tvm.__version__}) + "\n")
    out.flush()
    for line in inp:
        if not line.strip():
            continue
        try:
            reply = compile_program(json.loads(line))
        except Exception as e:  # noqa: BLE001 - every TVM error goes back to the caller, with its text
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    log = os.environ.get("TILECORE_TVM_CPU_LOG")  # the CPU seconds this worker used (tests measure their cost)
    if log:
        t = os.times()
        with open(log, "a") as f:
            f.write(f"{t.user + t.system:.2f}\n")


if __name__ == "__main__":
    # TVM prints warnings on stdout/stderr; keep our protocol on a private copy of stdout
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    serve(sys.stdin, proto)
