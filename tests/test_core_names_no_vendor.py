"""DESIGN decision 3: the core names no vendor. Vendor facts live in plugins and capability files."""
import re
from pathlib import Path

import tilecore

VENDOR_WORDS = ["cuda", "hip", "rocm", "musa", "ascend", "metal", "webgpu", "wgsl", "nvidia", "amd", "ptx"]
PATTERN = re.compile(r"(?<![a-z])(" + "|".join(VENDOR_WORDS) + r")(?![a-z])", re.IGNORECASE)


def test_core_package_source_names_no_vendor():
    root = Path(tilecore.__file__).parent
    hits = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".yaml", ".h", ".c", ".txt", ".md", ".json"):
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for m in PATTERN.finditer(line):
                    hits.append(f"{path.relative_to(root)}:{n}: {m.group(0)!r} in {line.strip()[:100]}")
    assert not hits, "vendor names in the core:\n" + "\n".join(hits)


def test_the_scan_would_catch_a_vendor_name():
    # guard against a pattern that can never match
    assert PATTERN.search("if target.kind == 'CUDA':")
    assert PATTERN.search("emit ptx here")
    assert not PATTERN.search("a chip with archival shipping")
