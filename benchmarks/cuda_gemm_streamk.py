"""Stream-K for the persistent GEMM's last wave (``tilecore.cuda.stream_k``, docs/decisions.md D53) against cuBLAS
and Triton, in the same run.

    python benchmarks/cuda_gemm_streamk.py [--shapes 4096x4096x4096,8192x8192x8192,...] [--dtypes float16,bfloat16]
                                          [--modes off,on,tail] [--rep 20] [--rounds 2] [--config 128:256:64:256:3:8]

For every dtype and shape: the README GEMM (``benchmarks/cuda_gemm.py``'s ``matmul``) at one configuration (the
default GEMM's: 128x256x64 tiles, 256 threads, 3 stages, swizzle panel 8) compiled once per ``tilecore.cuda.stream_k``
mode (off: whole tiles round robin, the kernel before D53; on: the partial wave's tiles and one whole wave in even
k ranges; tail: the partial wave's tiles only; stagger: tail's, each block's range between its whole tiles),
torch.matmul (cuBLAS) and a plain Triton GEMM, timed in
``--rounds`` interleaved rounds (best of each: the clocks of one GPU drift within a run), one line per shape with
TFLOP/s, each against cuBLAS, and on against off. Each mode's result is checked against a float64 reference (the
largest error relative to the largest reference element, beside off's) and said as same bits as off or not (a
split tile sums its partials in another order: within float32 rounding, not bit for bit).

``--profile``: first, per shape of the first dtype, each mode once more built with ``tilecore.cuda.pipeline_profile``
(D49's per-block cycle counts): ``cuda_gemm.py --profile``'s lines, and for stream-K the consumers' cycles a k step
in the stream-K pieces (their fixups left out) against the whole tiles, and the fixups' cycles a block
(tc_persistent.cuh's profile words 14 and 15).

Without a GPU it says so and exits with status 3.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tilecore  # noqa: E402
from cuda_gemm import NO_GPU_EXIT, PROF_WORDS, event_ms, has_gpu, matmul, profile_line, triton_matmul  # noqa: E402

MODES = {"off": False, "on": True, "tail": "tail", "stagger": "stagger", "auto": "auto"}
SHAPES = "4096x4096x4096,8192x8192x8192,4096x4096x14336,4096x14336x4096"
#: shapes whose A and B fit in the H100's 50 MB L2 (16 and 32 MB): where the stream-K pieces' k offsets, spread over
#: K, cost no DRAM traffic (round 1 of D53 lost 8-46% at the shapes above: the L2 question)
SMALL_K = "4096x4096x1024,8192x8192x1024,4096x4096x2048"


def sk_tiles(mode: str, tiles: int, blocks: int, k: int) -> int:
    """tc_persistent.cuh's tc_sk_tiles (the stream-K tiles; 0: none), for the profile's arithmetic."""
    if mode not in ("on", "tail", "stagger") or blocks <= 1 or tiles <= blocks or tiles % blocks == 0:
        return 0
    sk = tiles % blocks if mode in ("tail", "stagger") else tiles - (tiles // blocks - 1) * blocks
    return sk if sk * k >= 2 * blocks and sk * k * blocks < 2 ** 32 else 0


def profile_rows(torch, dtype: str, shape: str, cfg: tuple, modes: list) -> None:
    import statistics as st

    m, n, kk = (int(v) for v in shape.split("x"))
    a = torch.randn(m, kk, device="cuda").to(getattr(torch, dtype))
    b = torch.randn(kk, n, device="cuda").to(getattr(torch, dtype))
    c = torch.empty(m, n, device="cuda", dtype=getattr(torch, dtype))
    tiles, kt = -(-m // cfg[0]) * -(-n // cfg[1]), -(-kk // cfg[2])
    blocks = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    for mode in modes:
        k = tilecore.compile(matmul(m, n, kk, *cfg, dtype=dtype), target="cuda",
                             pass_configs={"tilecore.cuda.stream_k": MODES[mode], "tilecore.cuda.pipeline_profile": True})
        run = lambda k=k: k(a, b, c)  # noqa: E731
        print(profile_line(k, run, f"{dtype} {shape} stream_k {mode}"))
        sk = sk_tiles(mode, tiles, blocks, kt)
        if not sk:
            continue
        run()
        prog = k._load()
        prog.global_words("tc_pipe_prof", clear=True)
        run()
        words = prog.global_words("tc_pipe_prof", clear=True)
        ws = [words[i:i + PROF_WORDS] for i in range(0, len(words), PROF_WORDS)][:blocks]
        q = sk * kt / blocks  # each block's stream-K k steps (within one)
        skc = [w[14] - w[15] for w in ws]
        dpc = [(w[5] - w[14]) / max(w[8] - q, 1) for w in ws]
        print(f"    stream-K: {sk} tiles, {q:.1f} k steps a block; consumer 0: {st.median(skc) / q:.0f} cycles a k step "
              f"in the stream-K pieces (min {min(skc) / q:.0f}, max {max(skc) / q:.0f}), {st.median(dpc):.0f} in the "
              f"whole tiles; fixups {st.median(w[15] for w in ws):.0f} cycles a block (max "
              f"{max(w[15] for w in ws):.0f})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=f"{SHAPES},{SMALL_K}", help="MxNxK,...")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--modes", default="off,on,tail,stagger",
                    help="tilecore.cuda.stream_k values: off, on, tail, stagger, auto")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--config", default="128:256:64:256:3:8", help="block_M:block_N:block_K:threads:stages:panel")
    ap.add_argument("--no-triton", dest="triton", action="store_false")
    ap.add_argument("--profile", action="store_true", help="the pipeline profile of each mode first (D49's words)")
    ap.add_argument("--profile-shapes", default="4096x4096x4096,4096x4096x1024,4096x4096x14336")
    args = ap.parse_args()
    ok, why = has_gpu()
    if not ok:
        print(f"cuda_gemm_streamk.py: no GPU to measure on ({why}).")
        return NO_GPU_EXIT
    import torch

    cfg = tuple(int(x) for x in args.config.split(":"))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"device: {torch.cuda.get_device_name(0)} ({torch.cuda.get_device_properties(0).multi_processor_count} "
          f"SMs); torch {torch.__version__}; tilecore {tilecore.__version__}; config {cfg}")
    triton_mm = triton_matmul() if args.triton else None
    if args.profile:
        for shape in args.profile_shapes.split(","):
            try:
                profile_rows(torch, args.dtypes.split(",")[0], shape, cfg, modes)
            except Exception as e:  # noqa: BLE001 - the profile is a diagnosis; the table below still runs
                print(f"  profile {shape}: failed ({type(e).__name__}: {e})")
    rows = []
    for dtype in args.dtypes.split(","):
        tdt = getattr(torch, dtype)
        for shape in args.shapes.split(","):
            m, n, kk = (int(v) for v in shape.split("x"))
            torch.manual_seed(0)
            a = torch.randn(m, kk, device="cuda").to(tdt)
            b = torch.randn(kk, n, device="cuda").to(tdt)
            ref = (a.double() @ b.double())
            scale = ref.abs().max().item()
            flops = 2.0 * m * n * kk
            runs, notes, errs, outs = {}, {}, {}, {}
            for mode in modes:
                k = tilecore.compile(matmul(m, n, kk, *cfg, dtype=dtype), target="cuda",
                                     pass_configs={"tilecore.cuda.stream_k": MODES[mode]})
                note = " ".join(k.meta["attrs"].get("hopper_pipelines", ()))
                notes[mode] = ("stream_k" in note and "not stream_k" not in note and "stream_k off" not in note)
                c = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
                k(a, b, c)
                torch.cuda.synchronize()
                outs[mode] = c.clone()
                errs[mode] = ((c.double() - ref).abs().max().item() / scale)
                runs[mode] = (lambda k=k, c=c: k(a, b, c))
            cb = torch.empty(m, n, device="cuda", dtype=tdt)
            runs["cublas"] = lambda: torch.matmul(a, b, out=cb)
            if triton_mm is not None:
                ct = torch.empty(m, n, device="cuda", dtype=tdt)
                triton_mm(a, b, ct)  # autotune outside the timing
                runs["triton"] = lambda: triton_mm(a, b, ct)
            best = {}
            for _ in range(args.rounds):
                for name, fn in runs.items():
                    best[name] = min(best.get(name, float("inf")), event_ms(fn, args.rep))
            tf = {name: flops / ms / 1e9 for name, ms in best.items()}
            tiles = -(-m // cfg[0]) * -(-n // cfg[1])
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            same = {mode: bool(torch.equal(outs[mode], outs[modes[0]])) for mode in modes}
            rows.append((dtype, shape, tiles, sms, kk // cfg[2], tf, errs, same, notes))
            cells = "  ".join(f"{mode} {tf[mode]:.1f} ({tf[mode] / tf['cublas']:.3f}x)" for mode in modes)
            print(f"{dtype} {shape}: {tiles} tiles / {sms} SMs = {tiles / sms:.2f} waves; {cells}  "
                  f"cuBLAS {tf['cublas']:.1f}" + (f"  Triton {tf['triton']:.1f}" if "triton" in tf else ""), flush=True)
    print()
    head = " | ".join(f"{mo} TFLOP/s (x cuBLAS)" for mo in modes)
    print(f"| dtype | shape | tiles / SMs | {head} | on / off | cuBLAS | Triton | max err / max ref (per mode) "
          f"| same bits as {modes[0]} |")
    print("|" + "---|" * (7 + len(modes)))
    for dtype, shape, tiles, sms, kt, tf, errs, same, notes in rows:
        cells = " | ".join(f"{tf[mo]:.1f} ({tf[mo] / tf['cublas']:.3f}x)" + ("" if notes[mo] or mo == "off" else " [not taken]")
                           for mo in modes)
        ratio = f"{tf['on'] / tf['off']:.3f}" if "on" in tf and "off" in tf else "-"
        tri = f"{tf['triton']:.1f}" if "triton" in tf else "-"
        err = ", ".join(f"{mo} {errs[mo]:.1e}" for mo in modes)
        sb = ", ".join(f"{mo} {same[mo]}" for mo in modes[1:])
        print(f"| {dtype} | {shape} | {tiles} / {sms} = {tiles / sms:.2f} | {cells} | {ratio} | {tf['cublas']:.1f} | "
              f"{tri} | {err} | {sb} |")
    bad = [r for r in rows if any(e > 1e-2 for e in r[6].values())]
    if bad:
        print(f"FAIL: a result off the float64 reference by more than 1e-2 of its largest element: "
              f"{[(r[0], r[1]) for r in bad]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
