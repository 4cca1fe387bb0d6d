"""FlashAttention's general path against the register program under Nsight Compute (decision D70): one launch of
each kernel profiled (``--launch-skip 2 --launch-count 1``, clocks locked to base, caches flushed: ncu's defaults),
the same row side by side.

    python scripts/fa_profile.py [--rows x176,gqa_fc,d256] [--variants route,default] [--batch 4] [--ncu PATH]
        [--config VARIANT:KEY=VALUE ...] [--top 14]

Rows (the forms D66 left below 0.97x): ``x176`` d128 exact 128x176 non-causal, ``gqa_fc`` d128 fast math GQA (8 KV
heads) causal 128x128, ``d256`` d256 exact 128x64 non-causal, ``c128`` d128 exact causal 128x128, ``f128`` d128 fast
128x128 non-causal (h32 s4096, ``--batch``). Variants: ``route`` (the route's default; D86 retired ``regprog``,
the WGMMA register program), ``default`` (the general path's defaults), and any ``--config VARIANT:KEY=VALUE`` (the general path with that pass config; repeat
it for several keys of one variant).

Prints per row: (1) the kernel's duration at ncu's locked clock, issue slots busy, achieved occupancy, dram / L2 /
tensor-pipe throughput, the stall reasons (pc sampling, share of samples); (2) the stall samples by region of the
SASS (the consumers' main loop, the producer's loop, the rest) and instruction class (HGMMA issue, the wgmma wait
WARPGROUP.DEPBAR, mbarrier waits SYNCS.PHASECHK with their retry stubs folded back, named barriers BAR.SYNC /
BAR.ARV: ping-pong's turns, MUFU, float math, ...); (3) the instructions with the most samples. The regions come from
the kernel's own SASS (cuobjdump in the child), matched to ncu's source page by offset.

``--child ROW VARIANT OUTDIR``: the process ncu runs (builds the kernel, launches it 3 times, writes its SASS).
Exits 2 with a clear message without ncu or a GPU; ncu's own errors (e.g. ERR_NVGPUCTRPERM: no access to the
performance counters) are printed as they come.
"""
from __future__ import annotations

import argparse
import ast
import collections
import csv
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

#: name -> (dim, bm, bn, causal, fast, kv_heads)
ROWS = {"x176": (128, 128, 176, False, False, None), "gqa_fc": (128, 128, 128, True, True, 8),
        "d256": (256, 128, 64, False, False, None), "c128": (128, 128, 128, True, False, None),
        "f128": (128, 128, 128, False, True, None), "x128": (128, 128, 128, False, False, None),
        "gqa_f": (128, 128, 128, False, True, 8), "d256c": (256, 128, 64, True, False, None),
        # D81: d64 with two consumer warpgroups, exact non-causal and fast causal (the rows D77 measured at 0.925 / 0.94)
        "d64": (64, 128, 128, False, False, None), "d64_fc": (64, 128, 128, True, True, None),
        # D87: d128 causal, fast math at 128x128, both builds at 128x176 (issue 17's causal rows)
        "fc128": (128, 128, 128, True, True, None), "c176": (128, 128, 176, True, False, None),
        "fc176": (128, 128, 176, True, True, None)}
VARIANTS = {"route": {},  # the route's default (D86: the general path with a form's defaults)
            "default": {"tilecore.cuda.register_programs": False},
            # D70: the iteration unswitched on the split mask's condition; the mask before the first gemm
            "unswitch": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": True},
            "unswitch_c": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": True,
                           "tilecore.reduce_chains": 4},
            "unswitch_cd": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": True,
                            "tilecore.reduce_chains": 4, "tilecore.cuda.descriptor_offsets": True},
            "maskpre": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_after_gemm": False},
            # D74: descriptor offsets where the carried fragments fit (on at d128 128x128, GQA, d256, d64); with
            # ping-pong's turns off too (the register program's fast-math schedule)
            "fit": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": "fit"},
            "fit_nopp": {"tilecore.cuda.register_programs": False, "tilecore.cuda.descriptor_offsets": "fit",
                         "tilecore.pingpong": False},
            # D74: the unmasked and the masked iterations in two loops, with fit
            "loops_fit": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_mask_unswitch": "loops",
                          "tilecore.cuda.descriptor_offsets": "fit"},
            # D87: SDPA cuDNN at the row's shape (the reference; its kernel, not ours: no regions)
            "cudnn": {"sdpa": "cudnn"},
            # D87: O's rescale in the next turn; with the row maximum as four partial chains
            "sit": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_scale_in_turn": True},
            "sit_ch4": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_scale_in_turn": True,
                        "tilecore.reduce_chains": 4},
            "dsc": {"tilecore.cuda.register_programs": False, "tilecore.pipeline_scale_in_turn": True,
                    "tilecore.reduce_chains": 4, "tilecore.cuda.descriptor_offsets": True}}
#: D87: ``--tail``'s metrics: the SMs' active cycles (max / mean: the grid's tail), instructions by pipe
TAIL_METRICS = ("sm__cycles_active.max", "sm__cycles_active.avg", "sm__cycles_active.min", "sm__cycles_elapsed.max",
                "smsp__inst_executed.sum", "smsp__inst_executed_pipe_xu.sum", "smsp__inst_executed_pipe_fma.sum",
                "smsp__inst_executed_pipe_alu.sum", "smsp__inst_executed_pipe_uniform.sum",
                "smsp__inst_executed_pipe_fmaheavy.sum")
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats", "SourceCounters",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")


def build(row: str, configs: dict, batch: int):
    import tilecore
    from tilecore_conformance.composite import flash_attention_forward

    dim, bm, bn, causal, fast, kvh = ROWS[row]
    func = flash_attention_forward(4096, dim, 32, bm, bn, "float16", causal, batch=batch, threads=256, num_stages=2,
                                   kv_heads=kvh)
    return tilecore.compile(func, target="cuda:sm_90a", out_idx=[3],
                            pass_configs={"tilecore.fast_math": fast, **configs})


def child(row: str, configs: dict, batch: int, outdir: Path) -> int:
    import torch

    import tilecore_cuda

    dim, _, _, causal, _, kvh = ROWS[row]
    if "sdpa" in configs:  # D87: the reference's kernel at the row's shape (GQA's K / V repeated to the heads)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        g = torch.Generator(device="cuda").manual_seed(0)
        q, kk, v = (torch.randn(batch, 32, 4096, dim, device="cuda", dtype=torch.float16, generator=g)
                    for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, kk, v, is_causal=causal)
        torch.cuda.synchronize()
        return 0
    k = build(row, configs, batch)
    try:
        (outdir / "kernel.sass").write_text(tilecore_cuda.CUDABackend().disassemble(k.binary, k.target))
    except (SystemExit, OSError) as e:
        print(f"fa_profile: no SASS for the regions ({e})", file=sys.stderr)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 32, 4096, dim, device="cuda", dtype=torch.float16, generator=g)
    kk, v = (torch.randn(batch, kvh or 32, 4096, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    for _ in range(3):
        k(q, kk, v)
    torch.cuda.synchronize()
    return 0


def find_ncu(arg: str | None) -> str | None:
    if arg:
        return arg
    cands = [shutil.which("ncu")] + sorted(glob.glob("/usr/local/cuda*/bin/ncu")) + \
        sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")) + sorted(glob.glob("/usr/local/cuda*/nsight-compute*/ncu"))
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def ncu_or_none(arg: str | None, who: str) -> str | None:
    """:func:`find_ncu`, its version printed; None (and a line on stderr naming where it looked) without one."""
    ncu = find_ncu(arg)
    if ncu is None:
        print(f"{who}: Nsight Compute (ncu) not found on PATH, /usr/local/cuda*/bin or /opt/nvidia/nsight-compute",
              file=sys.stderr)
        return None
    ver = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    print(f"ncu: {ncu} ({ver[-1] if ver else '?'})")
    return ncu


def parse_configs(items: list, table: dict, new=None, error=None) -> dict:
    """``table`` (name -> pass configs, or name -> (shape, pass configs) where ``new`` is None) with each
    ``NAME:KEY=VALUE`` of ``items`` added (VALUE a Python literal, else a string): a name not in ``table`` starts from
    ``new()``, or is ``error(message)`` where ``new`` is None."""
    out = dict(table)
    for c in items:
        name, _, kv = c.partition(":")
        key, _, v = kv.partition("=")
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            pass
        if name not in out:
            if new is None:
                error(f"--config {c}: no {name!r} (of {', '.join(out)})")
                continue
            out[name] = new()
        if isinstance(out[name], tuple):  # (shape, pass configs)
            out[name] = (out[name][0], {**out[name][1], key: v})
        else:
            out[name] = {**out[name], key: v}
    return out


def profile(ncu: str, kernel_regex: str, argv: list, rep: str, timeout: int, label: str,
            metrics: tuple = ()) -> bool:
    """One profiled launch (the third of ``kernel_regex``'s kernels: ``--launch-skip 2 --launch-count 1``, the
    :data:`SECTIONS`, ``metrics`` where given; clocks locked, caches flushed: ncu's defaults) of the process
    ``argv`` into ``rep`` (.ncu-rep added); progress and ncu's errors on stderr. Where this ncu refuses
    a metric, once more with the sections alone. True where the report was written."""
    cmd = [ncu, "--target-processes", "all", "-k", f"regex:{kernel_regex}", "--launch-skip", "2", "--launch-count", "1",
           *sum((["--section", s] for s in SECTIONS), []), *(["--metrics", ",".join(metrics)] if metrics else []),
           "--import-source", "no", "-f", "-o", rep, *argv]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if metrics and p.returncode != 0 and "metric" in (p.stdout + p.stderr).lower():
            print(f"{label}: ncu refused --metrics ({(p.stdout + p.stderr).strip()[-300:]}); again without",
                  file=sys.stderr)
            k = cmd.index("--metrics")
            p = subprocess.run(cmd[:k] + cmd[k + 2:], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{label}: ncu ran past {timeout} s", file=sys.stderr)
        return False
    print(f"{label}: ncu rc={p.returncode} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    errs = [ln for ln in (p.stdout + p.stderr).splitlines() if "==ERROR==" in ln or "==WARNING==" in ln
            or "Traceback" in ln or "Error" in ln or "max error" in ln]
    if errs:
        print("\n".join(errs[:8]), file=sys.stderr)
    if p.returncode != 0 or not Path(rep + ".ncu-rep").exists():
        print((p.stdout + p.stderr)[-1500:], file=sys.stderr)
        return False
    return True


def _num(s: str) -> float | None:
    s = s.strip().replace(",", "")
    try:
        return float(s)
    except ValueError:
        return None


def raw_metrics(ncu: str, rep: str) -> dict:
    out = subprocess.run([ncu, "--import", rep, "--page", "raw", "--csv"], capture_output=True, text=True)
    rows = list(csv.reader(io.StringIO(out.stdout)))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None or len(rows) < head + 3:
        print(f"fa_profile: no raw page in {rep}: {out.stderr.strip()[:400]}", file=sys.stderr)
        return {}
    names, units, vals = rows[head], rows[head + 1], rows[head + 2]
    return {n: (_num(v), u) for n, u, v in zip(names, units, vals)}


def source_page(ncu: str, rep: str) -> tuple[list, list]:
    """(header, rows) of ncu's source page (SASS, one row an instruction)."""
    out = subprocess.run([ncu, "--import", rep, "--page", "source", "--csv", "--print-source", "sass"],
                         capture_output=True, text=True)
    rows = list(csv.reader(io.StringIO(out.stdout)))
    head = next((i for i, r in enumerate(rows) if any(c.strip().lower() == "address" or c.strip() == "# Address"
                                                     for c in r) and any("Source" in c for c in r)), None)
    if head is None:
        print(f"fa_profile: no source page ({out.returncode}): {out.stderr.strip()[:400]} {out.stdout[:400]}",
              file=sys.stderr)
        return [], []
    return rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]


# -- the SASS's regions ------------------------------------------------------------------------------------------

def regions(sass: str) -> tuple[dict, dict]:
    """({offset: region}, {offset: offset it stands for}): region "loop" (the consumers' main loop: the shortest
    backward-branch loop with 16+ HGMMA, or 8 / 4 at small tiles), "producer" (the shortest loop holding UTMALDG and
    no HGMMA), "other"; a retry stub (``[YIELD] TRYWAIT; @!P BRA stub; BRA back``, placed after the kernel's end)
    stands for the mbarrier wait before ``back`` and takes its region."""
    import sass_paths

    ins = sass_paths.parse(sass)
    addr = [a for a, _ in ins]
    pos = {a: k for k, a in enumerate(addr)}
    stands = {a: a for a in addr}
    stub_of = {}
    for i in range(len(ins) - 2):
        t0, t1, t2 = ins[i][1], ins[i + 1][1], ins[i + 2][1]
        m1, m2 = sass_paths._TARGET.search(t1), sass_paths._TARGET.search(t2)
        if "SYNCS.PHASECHK" not in t0 or not (m1 and t1.startswith("@") and sass_paths.opcode(t1) == "BRA") or \
                not (m2 and not t2.startswith("@") and sass_paths.opcode(t2) == "BRA"):
            continue
        start, back = int(m1.group(1), 16), int(m2.group(1), 16)
        if start > ins[i][0] or start not in pos or back not in pos:
            continue
        wait = next((b for b in reversed(addr[:pos[back]]) if "SYNCS.PHASECHK" in ins[pos[b]][1]), back)
        for k in range(pos[start], i + 3):
            stub_of[addr[k]] = wait
    body = [x for x in ins if x[0] not in stub_of]
    loop = set()
    for m in (16, 8, 4):
        try:
            loop = {body[k][0] for k in sass_paths.main_loop(body, m)}
            break
        except ValueError:
            continue
    best = None
    for a, t in body:
        mt = sass_paths._TARGET.search(t)
        if not mt or sass_paths.opcode(t) != "BRA" or int(mt.group(1), 16) >= a:
            continue
        tgt = int(mt.group(1), 16)
        span = [x for x in body if tgt <= x[0] <= a]
        ops = [sass_paths.opcode(x[1]) for x in span]
        if "UTMALDG" in ops and "HGMMA" not in ops and (best is None or len(span) < len(best)):
            best = span
    prod = {x[0] for x in best} if best else set()
    reg = {a: ("loop" if a in loop else "producer" if a in prod else "other") for a in addr}
    for a, w in stub_of.items():
        reg[a], stands[a] = reg.get(w, "other"), w
    return reg, stands


#: SASS instruction classes by opcode prefix, read in order (the first match wins: PHASECHK before the other SYNCS,
#: the uniform datapath last among the prefixes)
_PREFIX_CLASSES = (
    (("HGMMA",), "HGMMA"),
    (("WARPGROUP.DEPBAR",), "wgmma wait"),
    (("WARPGROUP.ARRIVE", "WARPSYNC"), "wgmma fence"),
    (("SYNCS.PHASECHK",), "mbarrier wait"),
    (("SYNCS",), "mbarrier arrive"),
    (("BAR.SYNC", "BAR.RED"), "bar.sync (turns)"),
    (("BAR.ARV",), "bar.arrive"),
    (("MUFU",), "MUFU"),
    (("SHFL",), "SHFL"),
    (("UTMA", "UBLKCP"), "TMA"),
    (("STS", "LDS", "STG"), "shared/global st/ld"),
    (("EXIT",), "EXIT (idle warps)"),
    (("BRA",), "branch"),
    (("U", "R2UR"), "uniform"),
)
#: float opcodes matched by their whole name before the first "." (FSETP.GT, F2FP.F16...)
_FLOAT_OPS = frozenset(("FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "F2FP", "HADD2", "HMUL2", "FCHK"))


def klass(text: str) -> str:
    """The class of one SASS instruction (its predicate guard dropped) for the profile's per-class table."""
    t = re.sub(r"^@!?U?P\w+\s+", "", text.strip())
    op = t.split()[0] if t.split() else "?"
    if op.split(".")[0] in _FLOAT_OPS:
        return "float"
    for prefixes, name in _PREFIX_CLASSES:
        if op.startswith(prefixes):
            return name
    return "other int"


def analyse(ncu: str, rep: str, sass: str | None, top: int) -> dict:
    met = raw_metrics(ncu, rep)
    head, rows = source_page(ncu, rep)
    res = {"metrics": met, "by": collections.Counter(), "reasons_by": collections.defaultdict(collections.Counter),
           "top": [], "total": 0.0, "cols": head}
    if not rows:
        return res
    ai = next(i for i, c in enumerate(head) if c.strip().lower() in ("address", "# address"))
    si = next(i for i, c in enumerate(head) if c.strip() == "Source")
    samp = [i for i, c in enumerate(head) if "Sampling (All" in c] or \
        [i for i, c in enumerate(head) if "sampl" in c.lower()]
    if not samp:
        print(f"fa_profile: the source page has no sampling column: {head}", file=sys.stderr)
        return res
    reason_cols = [i for i, c in enumerate(head) if c.lower().startswith("stall_") or
                   (c.lower().startswith("warp stall sampling") and i != samp[0] and "Not-issued" not in c and
                    "All" not in c)]
    ins = []
    for r in rows:
        a = _num(r[ai]) if not r[ai].strip().startswith("0x") else int(r[ai].strip(), 16)
        if a is None:
            continue
        ins.append((int(a), r[si], _num(r[samp[0]]) or 0.0, {head[i]: _num(r[i]) or 0.0 for i in reason_cols}))
    base = min(a for a, *_ in ins)
    reg, stands = regions(sass) if sass else ({}, {})
    total = sum(s for _, _, s, _ in ins) or 1.0
    res["total"] = total
    per_ins = collections.Counter()
    text_of = {a - base: text for a, text, _, _ in ins}
    for a, text, s, reasons in ins:
        off = a - base
        region = reg.get(off, "?")
        home = stands.get(off, off)
        c = klass(text_of.get(home, text))
        res["by"][(region, c)] += s
        for n, v in reasons.items():
            res["reasons_by"][(region, c)][n] += v
        per_ins[(home, region)] += s
    res["top"] = [(off, region, text_of.get(off, "?"), s / total) for (off, region), s in per_ins.most_common(top)]
    return res


# -- the report ---------------------------------------------------------------------------------------------

PICK = [("duration us", r"^gpu__time_duration\.sum$", 1e-3),
        ("issue slots busy %", r"^sm__inst_issued\.avg\.pct_of_peak_sustained_active$|"
                               r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$", 1),
        ("achieved occupancy %", r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$", 1),
        ("SM throughput %", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
        ("tensor pipe %", r"^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$|"
                          r"^sm__inst_executed_pipe_tensor_op_gmma\.avg\.pct_of_peak_sustained_active$", 1),
        ("dram %", r"^dram__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
        ("L2 %", r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
        ("registers / thread", r"^launch__registers_per_thread$", 1),
        ("SM clock MHz", r"^sm__cycles_elapsed\.avg\.per_second$|^smsp__cycles_elapsed\.avg\.per_second$", 1e-6),
        ("warp cycles / issued", r"^smsp__average_warp_latency_per_inst_issued\.ratio$|"
                                 r"^smsp__warps_active\.avg\.per_cycle_active$", 1)]


def pick(met: dict, pattern: str, scale: float) -> str:
    for n, (v, u) in met.items():
        if re.match(pattern, n) and v is not None:
            if "duration" in n and u.strip() in ("usecond", "us"):
                scale = 1.0
            elif "duration" in n and u.strip() in ("msecond", "ms"):
                scale = 1e3
            return f"{v * scale:.1f}"
    return "-"


def stall_shares(met: dict) -> dict:
    """reason -> share of the pc samples (smsp__pcsamp_warps_issue_stalled_*), else the per-issue warp latency
    (smsp__average_warp_latency_issue_stalled_* / inst issued)."""
    pc = {n[len("smsp__pcsamp_warps_issue_stalled_"):]: v for n, (v, _) in met.items()
          if n.startswith("smsp__pcsamp_warps_issue_stalled_") and v is not None and not n.endswith("_not_issued")}
    tot = sum(pc.values())
    if tot:
        return {k: 100.0 * v / tot for k, v in pc.items()}
    lat = {}
    for n, (v, _) in met.items():
        m = re.match(r"smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)(?:_per_issue_active)?\.ratio$", n)
        if m and v is not None:
            lat[m.group(1)] = v
    tot = sum(lat.values())
    return {k: 100.0 * v / tot for k, v in lat.items()} if tot else {}


def report(row: str, results: dict, top: int) -> None:
    names = list(results)
    print(f"\n=== {row}: {ROWS[row]} (dim, bm, bn, causal, fast, kv heads) ===")
    w = 24
    print("metric".ljust(w) + "".join(n.rjust(18) for n in names))
    for label, pat, sc in PICK:
        print(label.ljust(w) + "".join(pick(results[n]["metrics"], pat, sc).rjust(18) for n in names))
    for m in TAIL_METRICS:
        if any(m in results[n]["metrics"] for n in names):
            print(m[:w - 1].ljust(w) + "".join(f"{(results[n]['metrics'].get(m, (None,))[0] or 0):.4g}".rjust(18)
                                               for n in names))
    act = {n: results[n]["metrics"] for n in names}
    if any("sm__cycles_active.max" in a for a in act.values()):
        print("SM active max / mean".ljust(w) + "".join(
            (f"{a['sm__cycles_active.max'][0] / a['sm__cycles_active.avg'][0]:.4f}"
             if a.get("sm__cycles_active.max", (None,))[0] and a.get("sm__cycles_active.avg", (None,))[0]
             else "-").rjust(18) for a in act.values()))
    dur = {n: _num(pick(results[n]["metrics"], PICK[0][1], PICK[0][2]) or "") for n in names}
    if "cudnn" in dur and dur["cudnn"]:
        print("cudnn / this (speed)".ljust(w) + "".join(
            (f"{dur['cudnn'] / dur[n]:.3f}" if dur[n] else "-").rjust(18) for n in names))
    shares = {n: stall_shares(results[n]["metrics"]) for n in names}
    keys = sorted({k for s in shares.values() for k in s}, key=lambda k: -max(s.get(k, 0) for s in shares.values()))
    print("-- stall reasons, % of samples (kernel-wide)")
    for k in keys[:12]:
        print(f"  {k}".ljust(w) + "".join(f"{shares[n].get(k, 0):.1f}".rjust(18) for n in names))
    # the samples of warps parked at EXIT (the register program's idle producer warps) left out of the shares
    busy = {n: results[n]["total"] - sum(v for (r, c), v in results[n]["by"].items() if c == "EXIT (idle warps)")
            for n in names}
    print("-- samples at EXIT (idle warps), % of all".ljust(w) + "".join(
        f"{100.0 * (1 - busy[n] / results[n]['total']) if results[n]['total'] else 0:.1f}".rjust(18) for n in names))
    print("-- samples by region / class, % of the samples outside EXIT")
    cells = sorted({rc for n in names for rc in results[n]["by"]},
                   key=lambda rc: -max(results[n]["by"].get(rc, 0) / busy[n] for n in names if busy[n]))
    for rc in cells[:22]:
        if rc[1] == "EXIT (idle warps)":
            continue
        vals = [100.0 * results[n]["by"].get(rc, 0) / busy[n] if busy[n] else 0 for n in names]
        if max(vals) < 0.3:
            continue
        print(f"  {rc[0][:8]}: {rc[1]}".ljust(w) + "".join(f"{v:.1f}".rjust(18) for v in vals))
        rs = collections.Counter()
        for n in names:
            rs.update({k: v for k, v in results[n]["reasons_by"].get(rc, {}).items()})
        for rname, _ in rs.most_common(3):
            if not rname:
                continue
            print(f"      {rname[:18]}".ljust(w) + "".join(
                f"{100.0 * results[n]['reasons_by'].get(rc, {}).get(rname, 0) / (busy[n] or 1):.1f}".rjust(18)
                for n in names))
    for n in names:
        print(f"-- {n}: top instructions (offset, region, % samples)")
        for off, region, text, share in results[n]["top"]:
            print(f"  {off:#07x} {region[:8]:8s} {100 * share:5.1f}%  {text.strip()[:90]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="x176,gqa_fc,d256")
    ap.add_argument("--variants", default="route,default")
    ap.add_argument("--config", action="append", default=[], metavar="VARIANT:KEY=VALUE")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/faprof")
    ap.add_argument("--timeout", type=int, default=100, help="seconds for one profiled process")
    ap.add_argument("--child", nargs=3, metavar=("ROW", "VARIANT", "OUTDIR"))
    ap.add_argument("--configs", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--tail", action="store_true", help="also the SMs' active cycles (max / mean: the grid's tail) "
                    "and the instructions by pipe (D87)")
    args = ap.parse_args()
    if "regprog" in args.variants.split(","):
        ap.error("variant regprog: the WGMMA register program is retired (docs/decisions.md D86); profile route / "
                 "default (the general path) / its options (the first variant is the speed reference)")
    if args.child:
        return child(args.child[0], ast.literal_eval(args.configs), args.batch, Path(args.child[2]))
    variants = parse_configs(args.config, VARIANTS, new=lambda: {"tilecore.cuda.register_programs": False})
    rows, names = args.rows.split(","), args.variants.split(",")
    bad = [r for r in rows if r not in ROWS] + [n for n in names if n not in variants]
    if bad:
        ap.error(f"unknown {', '.join(bad)}; rows {', '.join(ROWS)}; variants {', '.join(variants)}")
    ncu = ncu_or_none(args.ncu, "fa_profile")
    if ncu is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rc = 0
    for i, row in enumerate(rows):
        results = {}
        # alternate the order row by row (the kernels run at ncu's locked clock, caches flushed, but the order is free)
        for n in (names if i % 2 == 0 else names[::-1]):
            d = out / f"{row}-{n}"
            d.mkdir(exist_ok=True)
            rep = str(d / "prof")
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", row, n, str(d), "--batch",
                     str(args.batch), "--configs", repr(variants[n])]
            regex = "cudnn|sdpa|fmha|flash|fprop|Fmha|Sdpa" if "sdpa" in variants[n] else "tc_kernel"
            if not profile(ncu, regex, argv, rep, args.timeout, f"{row} {n}",
                           metrics=TAIL_METRICS if args.tail else ()):
                rc = 1
                continue
            sass = (d / "kernel.sass").read_text() if (d / "kernel.sass").exists() else None
            results[n] = analyse(ncu, rep + ".ncu-rep", sass, args.top)
            if i == 0 and n == names[0]:
                print(f"(source page columns: {results[n]['cols']})")
        if results:
            report(row, {n: results[n] for n in names if n in results}, args.top)
    return rc


if __name__ == "__main__":
    sys.exit(main())
