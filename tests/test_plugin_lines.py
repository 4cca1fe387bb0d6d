"""scripts/plugin_lines.py (docs/layout.md "What a backend writes"): the roles it gives files and its code-line count."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import plugin_lines  # noqa: E402


def test_code_lines_skip_docstrings_comments_and_blanks():
    text = '"""module\ndoc"""\n\n# a comment\ndef f(x):\n    """doc"""\n    return (x +\n            1)  # trailing\n'
    assert plugin_lines.code_lines(text) == 3  # def, return, its continuation


def test_roles():
    assert plugin_lines.role("backends/hip/tilecore_hip/units.py") == "matrix units"
    assert plugin_lines.role("backends/cuda/tilecore_cuda/regprog.py") == "matched forms"
    assert plugin_lines.role("backends/hip/tilecore_hip/regprog.py") == "spellings"  # only CUDA's are matched forms
    assert plugin_lines.role("backends/cuda/tilecore_cuda/prelude/tc_tma.cuh") == "headers"


def test_table_of_this_tree():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "plugin_lines.py"), "--markdown"], check=True,
                         capture_output=True, text=True).stdout
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in out.splitlines()[2:]}
    for vendor in ("hip", "musa", "metal"):
        units, _, matched, _, _ = rows[vendor]
        assert units != "-" and matched == "-", (vendor, rows[vendor])
    assert rows["cuda"][2] != "-"
