#!/usr/bin/env python3
"""Draw the registered fragment layouts as SVG pictures for docs/layout.md (docs/layouts/*.svg).

Each picture is the fragment's grid (rows down, columns across); a cell says which thread and which of its
registers holds the element (``T5 r3``), coloured by thread, in the manner of the fragment figures of
vendors' ISA manuals. Usage: ``python scripts/draw_layouts.py [out_dir]`` (default docs/layouts). A test
(tests/test_layout.py) re-draws them and compares with the committed files: re-run this script after
changing a layout.
"""
from __future__ import annotations

import colorsys
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "backends" / "cuda", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

CELL_W, CELL_H, MARGIN, TITLE = 46, 24, 28, 22


def colour(thread: int) -> str:
    r, g, b = colorsys.hls_to_rgb((thread * 0.618034) % 1.0, 0.82, 0.55)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def svg(layout, title: str) -> str:
    rows, cols = layout.shape if len(layout.shape) == 2 else (1, layout.shape[0])
    w, h = 2 * MARGIN + cols * CELL_W, 2 * MARGIN + TITLE + rows * CELL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="monospace">',
           f'<text x="{MARGIN}" y="{MARGIN}" font-size="13">{title}</text>']
    top = MARGIN + TITLE
    for c in range(cols):
        out.append(f'<text x="{MARGIN + c * CELL_W + CELL_W // 2}" y="{top - 4}" font-size="9" '
                   f'text-anchor="middle" fill="#555">{c}</text>')
    for r in range(rows):
        out.append(f'<text x="{MARGIN - 4}" y="{top + r * CELL_H + CELL_H // 2 + 3}" font-size="9" '
                   f'text-anchor="end" fill="#555">{r}</text>')
        for c in range(cols):
            threads, reg = layout.locate((r, c) if len(layout.shape) == 2 else (c,))
            t = threads[0]
            label = f"T{t} r{reg}" + ("+" if len(threads) > 1 else "")
            x, y = MARGIN + c * CELL_W, top + r * CELL_H
            out.append(f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{colour(t)}" '
                       'stroke="#888" stroke-width="0.5"/>')
            out.append(f'<text x="{x + CELL_W // 2}" y="{y + CELL_H // 2 + 3}" font-size="9" '
                       f'text-anchor="middle">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def pictures() -> dict:
    """file name -> (layout, title) for every picture in docs/layout.md."""
    from fake_matrix_backend import fake_unit
    from tilecore.layout import blocked
    from tilecore_cuda.units import mma_16816_units, wgmma_accumulator

    mma, fake = mma_16816_units()[0], fake_unit()
    out = {}
    for role in "abc":
        lay = mma.layouts()[role]
        out[f"cuda_mma_m16n8k16_{role}.svg"] = (lay, f"CUDA mma.sync m16n8k16 {role.upper()} {lay.shape}: "
                                                     f"{lay.threads} threads x {lay.regs} regs")
    lay = wgmma_accumulator(16)
    out["cuda_wgmma_m64n16k16_c.svg"] = (lay, f"CUDA wgmma m64n16k16 accumulator {lay.shape}: "
                                              f"{lay.threads} threads x {lay.regs} regs")
    for role in "abc":
        lay = fake.layouts()[role]
        out[f"fake_16x16x8_{role}.svg"] = (lay, f"made-up test unit 16x16x8 {role.upper()} {lay.shape}: "
                                                f"{lay.threads} threads x {lay.regs} regs")
    lay = blocked((8, 16), 32, vector=2)
    out["blocked_8x16_32threads_vec2.svg"] = (lay, f"core blocked layout (8, 16) over 32 threads, 2 per vector: "
                                                   f"{lay.regs} regs")
    return out


def main(argv=None) -> int:
    out_dir = Path((argv or sys.argv[1:] or [ROOT / "docs" / "layouts"])[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (lay, title) in pictures().items():
        (out_dir / name).write_text(svg(lay, title))
    print(f"wrote {len(pictures())} pictures to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
