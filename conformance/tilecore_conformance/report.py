"""Reports: results.jsonl, manifest.json, junit.xml, matrix.md, matrix.html; merging runs from several devices.

Every writer takes *runs*: a list of ``(manifest, {case id: result})``, one per target and mode. A single
run writes one; ``merge`` writes the same files for several.
"""
from __future__ import annotations

import hashlib
import html
import json
import platform
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from . import __version__
from .model import FAILING, JUNIT, PASS, SEVERITY, STATES

COLORS = {"PASS": "#2e7d32", "FAIL": "#c62828", "NOT_SUPPORTED": "#757575", "EXPECTED_FAIL": "#ef6c00",
          "UNEXPECTED_PASS": "#ad1457", "CRASH": "#6a1b9a", "TIMEOUT": "#4e342e", "HARNESS_ERROR": "#000000"}
FILES = ("junit.xml", "results.jsonl", "manifest.json", "matrix.md", "matrix.html")


def _base() -> dict:
    import tilecore

    return {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "core_version": tilecore.__version__,
            "conformance_version": __version__,
            "host": {"python": platform.python_version(), "platform": platform.platform(),
                     "hostname": socket.gethostname()}}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def selection(config, catalog_cases: int, expectations: str | None) -> dict:
    """What the run was asked to run; ``write`` adds how many cases it ran and whether that is the catalog."""
    exp = Path(expectations) if expectations else None
    return {"keyword": config.getoption("keyword") or None, "markers": config.getoption("markexpr") or None,
            "expectations": str(exp) if exp else None,
            "expectations_sha256": _sha256(exp) if exp and exp.is_file() else None,
            "catalog_cases": catalog_cases, "pytest_args": [str(a) for a in config.invocation_params.args]}


def manifest(t, sel: dict) -> dict:
    from tilecore.plugin import get_registry

    return {
        **_base(), "target": t.name, "mode": t.mode,
        "backend": {"name": t.backend.name, "distribution": t.backend.distribution, "version": t.backend.version(),
                    "plugin_api": t.backend.plugin_api},
        "plugins": {r.name: {"version": r.version, "status": r.status_text} for r in get_registry().plugins()},
        "toolchain": t.backend.toolchain_version(t.target) or t.probe.toolchain,
        "capability_profile": t.caps.id, "capability_hash": t.caps.hash(),
        "device": {"status": t.probe.status, "devices": [d.name for d in t.probe.devices], "detail": t.probe.detail},
        "capability_mismatches": list(t.mismatches),
        "seeds": "sha256(case id)[:4] little-endian", "selection": sel, "pass_configs": _pass_configs(),
    }


def _pass_configs() -> dict:
    """The pass configs every case was compiled with beyond the defaults (``TILECORE_PASS_CONFIGS``,
    ``--pass-config``): a run under other options is not the default one, and its report says so."""
    import os

    try:
        configs = json.loads(os.environ.get("TILECORE_PASS_CONFIGS") or "{}")
    except ValueError:
        return {"unparsed": os.environ.get("TILECORE_PASS_CONFIGS")}
    return configs if isinstance(configs, dict) else {"unparsed": configs}


def failed_manifest(spec: str, error: str, sel: dict) -> dict:
    """The manifest of a run that stopped before any case because its target could not be resolved or probed."""
    return {**_base(), "target": spec, "mode": "none", "error": error, "backend": None,
            "device": {"status": "unresolved", "devices": [], "detail": ""}, "selection": sel}


def write(report_dir: Path, results: list, man: dict) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    results = sorted(results, key=lambda r: r["id"])
    _write_results(report_dir / "results.jsonl", results)
    sel = dict(man.get("selection") or {})
    sel["selected_cases"] = len(results)
    sel["full"] = (not man.get("error") and not sel.get("keyword") and not sel.get("markers")
                   and len(results) == sel.get("catalog_cases", len(results)))
    man = {**man, "selection": sel, "counts": dict(Counter(r["state"] for r in results)), "cases": len(results),
           "results_sha256": _sha256(report_dir / "results.jsonl")}
    (report_dir / "manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True))
    runs = [(man, {r["id"]: r for r in results})]
    write_junit(report_dir / "junit.xml", runs)
    write_matrix(report_dir, runs)


def _write_results(path: Path, results) -> None:
    with open(path, "w") as f:
        for r in results:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def column(man: dict) -> str:
    """One column per target and mode: reports never merge modes."""
    return f"{man['target']} ({man['mode']})"


def selection_text(man: dict) -> str:
    text = _selection_text(man)
    configs = man.get("pass_configs") or {}
    if configs:
        text += " under pass configs " + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(configs.items()))
    return text


def _selection_text(man: dict) -> str:
    sel = man.get("selection") or {}
    n, m = sel.get("selected_cases", man.get("cases", 0)), sel.get("catalog_cases")
    if man.get("error"):
        return f"stopped before any case ({m} in the catalog)"
    if sel.get("full", m is None):
        return f"all {n} cases"
    how = [f"-k {sel['keyword']!r}"] if sel.get("keyword") else []
    how += [f"-m {sel['markers']!r}"] if sel.get("markers") else []
    return f"filtered run: {n} of {m} cases" + (f" ({', '.join(how)})" if how else " (not every case has a result)")


def _verdict(man: dict, res: dict) -> bool:
    """True when the run passes: it ran, found no problem (a shrunk suite, a capability mismatch) and no
    case is in a failing state (the run's exit status says the same)."""
    return not man.get("error") and not man.get("problems") and not any(r["state"] in FAILING for r in res.values())


def _device(man: dict) -> str:
    dev = man.get("device") or {}
    return ", ".join(dev.get("devices") or []) or f"{dev.get('status', '?')}: {dev.get('detail') or ''}".strip(": ")


def _backend(man: dict) -> str:
    b = man.get("backend")
    return f"{b['distribution']} {b['version']}" if b else "-"


def _worst(r: dict) -> str:
    a, rel = r.get("max_abs_err"), r.get("max_rel_err")
    if a is None:
        return ""
    return f"abs {a:.3g}" + (f", rel {rel:.3g}" if rel is not None else "")


# ------------------------------------------------------------------------------------------------ JUnit XML

_XML_BAD = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text) -> str:
    """Text that XML 1.0 can hold (error messages may carry terminal escapes or NULs)."""
    return _XML_BAD.sub("?", str(text))


def _properties(man: dict) -> dict:
    sel = man.get("selection") or {}
    return {"target": man["target"], "mode": man["mode"], "device": _device(man),
            "device_status": (man.get("device") or {}).get("status", ""),
            "tilecore_version": man.get("core_version", ""), "conformance_version": man.get("conformance_version", ""),
            "backend": _backend(man), "capability_profile": man.get("capability_profile", ""),
            "toolchain": man.get("toolchain") or "", "selection": selection_text(man),
            "expectations": sel.get("expectations") or "", "created": man.get("created", ""),
            "hostname": (man.get("host") or {}).get("hostname", "")}


def _testcase(parent, classname: str, name: str, r: dict) -> None:
    tc = ET.SubElement(parent, "testcase", classname=_x(classname), name=_x(name),
                       time=f"{r.get('duration') or 0.0:.3f}")
    kind = JUNIT.get(r["state"])
    if kind is None:
        return
    err = r.get("error") or ""
    first = err.strip().splitlines()[0] if err.strip() else r["state"]
    detail = f"{err}\n\nstate {r['state']}, mode {r.get('mode')}, seed {r.get('seed')}" + \
        (f", worst error {_worst(r)}" if _worst(r) else "")
    msg = first if kind != "skipped" else f"{r['state']}: {first}"
    ET.SubElement(tc, kind, message=_x(msg[:500]), type=r["state"]).text = _x(detail.strip())


def _suite(man: dict, res: dict) -> ET.Element:
    target = man["target"]
    suite = ET.Element("testsuite", name=_x(f"tilecore-conformance[{target}]"),
                       timestamp=man.get("created", "")[:19], hostname=_x((man.get("host") or {}).get("hostname", "")))
    props = ET.SubElement(suite, "properties")
    for k, v in _properties(man).items():
        ET.SubElement(props, "property", name=k, value=_x(v))
    cases = sorted(res.values(), key=lambda r: r["id"])
    if man.get("error"):  # nothing ran: one error, so that no JUnit consumer reads an empty suite as green
        cases = [{"id": "target", "family": "harness", "state": "HARNESS_ERROR", "error": man["error"],
                  "mode": man["mode"], "seed": None}]
    for r in cases:
        _testcase(suite, f"{target}.{r['family']}", r["id"], r)
    kinds = Counter(JUNIT.get(r["state"]) for r in cases)
    suite.set("tests", str(len(cases)))
    for attr, kind in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        suite.set(attr, str(kinds[kind]))
    suite.set("time", f"{sum(r.get('duration') or 0.0 for r in cases):.3f}")
    return suite


def write_junit(path: Path, runs: list) -> None:
    root = ET.Element("testsuites", name="tilecore-conformance")
    for man, res in runs:
        root.append(_suite(man, res))
    for k in ("tests", "failures", "errors", "skipped"):
        root.set(k, str(sum(int(s.get(k)) for s in root)))
    root.set("time", f"{sum(float(s.get('time')) for s in root):.3f}")
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# ------------------------------------------------------------------------------------------------ matrices

def _rank(runs: list, cid: str) -> int:
    return min((SEVERITY.index(res[cid]["state"]) for _, res in runs if cid in res), default=len(SEVERITY))


def write_matrix(out: Path, runs: list) -> None:
    ids = sorted({i for _, res in runs for i in res})
    (out / "matrix.md").write_text(_markdown(runs, ids))
    (out / "matrix.html").write_text(_html(runs, ids))


def _banners(runs: list) -> list:
    """(kind, text) for what must not be missed: a run that stopped, a run that is not the whole catalog."""
    out = []
    for man, _ in runs:
        if man.get("error"):
            out.append(("error", f"{column(man)}: the run stopped before any case: {man['error']}"))
        elif not (man.get("selection") or {}).get("full", True):
            out.append(("filtered", f"{column(man)}: {selection_text(man)}"))
        out += [("error", f"{column(man)}: {p}") for p in man.get("problems") or []]
    return out


def _md(text) -> str:
    """A markdown table cell: a ``|`` in a value (toolchain strings hold one) must not split the cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _markdown(runs: list, ids: list) -> str:
    cols = [_md(column(m)) for m, _ in runs]
    lines = ["# tilecore conformance matrix", ""]
    for _, text in _banners(runs):
        lines += [f"> **{_md(text)}**", ""]
    lines += ["## Runs", "", "| run | verdict | device | backend | tilecore | conformance | created | selection |",
              "|---|---|---|---|---|---|---|---|"]
    for man, res in runs:
        cells = [column(man), "pass" if _verdict(man, res) else "**FAIL**", _device(man), _backend(man),
                 man.get("core_version", ""), man.get("conformance_version", ""), man.get("created", ""),
                 selection_text(man)]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["", "## Totals", "", "| state | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for s in STATES:
        lines.append(f"| {s} | " + " | ".join(str(sum(1 for r in res.values() if r["state"] == s)) for _, res in runs) + " |")
    lines += ["", "## Cases", "", "| case | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for cid in ids:
        lines.append(f"| {cid} | " + " | ".join(res.get(cid, {}).get("state", "-") for _, res in runs) + " |")
    return "\n".join(lines) + "\n"


_CSS = """
body{font:13px/1.35 system-ui,-apple-system,'Segoe UI',sans-serif;margin:14px 18px;color:#1d1d1d}
h1{font-size:19px;margin:0 0 2px}h2{font-size:15px;margin:14px 0 6px}.sub{color:#666;margin-bottom:8px}
.banner{padding:7px 12px;margin:6px 0;border-radius:4px;font-weight:600;font-size:14px}
.banner.filtered{background:#fff3cd;border:1px solid #d9a400}.banner.error{background:#fde2e2;border:1px solid #c62828}
table{border-collapse:collapse}td,th{padding:3px 8px;border-bottom:1px solid #e6e6e6;text-align:left;vertical-align:top}
th{background:#f4f4f4;font-weight:600}
.nw{white-space:nowrap}.tot{white-space:nowrap;margin-right:6px}.runs td{max-width:26em}
.st{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-weight:600;font-size:11px;line-height:17px}
.v-pass{color:#2e7d32;font-weight:700}.v-fail{color:#c62828;font-weight:700}
#bar{position:sticky;top:0;z-index:2;background:#fff;padding:8px 0;border-bottom:2px solid #ddd;display:flex;
 flex-wrap:wrap;gap:6px 14px;align-items:center}
#q{width:300px;padding:4px 6px;font-size:13px}#bar label{cursor:pointer;white-space:nowrap}
#shown{color:#555;margin-left:auto}
#cases{width:100%;table-layout:fixed}#cases col.id{width:26em}#cases td{overflow:hidden}
#cases thead th{position:sticky;top:var(--bar,46px);z-index:1}
#cases td:first-child{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:nowrap}
tr[hidden]{display:none}.num{color:#666;font-size:11px}
summary{cursor:pointer;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.snip{color:#444;font-size:12px}details[open] .snip{display:none}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font-size:11.5px;background:#f7f7f7;padding:6px;
 border-left:3px solid #bbb;max-width:70em}
.meta{color:#555;font-size:11px}.miss{color:#aaa}
"""

_JS = """
(function(){
var q=document.getElementById('q'),ff=document.getElementById('ff'),body=document.querySelector('#cases tbody'),
 rows=Array.prototype.slice.call(body.rows),
 boxes=Array.prototype.slice.call(document.querySelectorAll('#states input')),
 shown=document.getElementById('shown'),bar=document.getElementById('bar');
rows.forEach(function(r){r._t=r.textContent.toLowerCase();});
function apply(){
 var on={};boxes.forEach(function(b){on[b.value]=b.checked;});
 var terms=q.value.toLowerCase().split(/\\s+/).filter(Boolean),n=0;
 rows.forEach(function(r){
  var ok=r.dataset.s.split(' ').some(function(s){return on[s];})&&
   terms.every(function(t){return r._t.indexOf(t)>=0;});
  r.hidden=!ok;if(ok)n++;});
 shown.textContent='showing '+n+' of '+rows.length+' cases';
}
function order(){
 rows.slice().sort(function(a,b){return (ff.checked?a.dataset.r-b.dataset.r:0)||a.dataset.i-b.dataset.i;})
  .forEach(function(r){body.appendChild(r);});
}
q.addEventListener('input',apply);boxes.forEach(function(b){b.addEventListener('change',apply);});
ff.addEventListener('change',order);
document.getElementById('problems').addEventListener('click',function(){
 boxes.forEach(function(b){b.checked=b.value!=='PASS'&&b.value!=='NOT_SUPPORTED';});apply();});
document.getElementById('all').addEventListener('click',function(){
 boxes.forEach(function(b){b.checked=true;});q.value='';apply();});
document.getElementById('open').addEventListener('click',function(){
 var open=this.dataset.open!=='1';this.dataset.open=open?'1':'0';this.textContent=open?'close details':'open details';
 rows.forEach(function(r){if(!r.hidden)r.querySelectorAll('details').forEach(function(d){d.open=open;});});});
document.documentElement.style.setProperty('--bar',bar.offsetHeight+'px');
apply();
})();
"""


def _h(text) -> str:
    return html.escape(_x(text))


def _badge(state: str) -> str:
    return f'<span class="st" style="background:{COLORS.get(state, "#000")}">{html.escape(state)}</span>'


_LOCATION = re.compile(r"^\S+:\d+ in \S+: ")  # "file.py:12 in kernel: " before a compile error's message


def _cell(r: dict | None) -> str:
    if r is None:
        return '<td class="miss">-</td>'
    e = _h
    worst = f' <span class="num">{e(_worst(r))}</span>' if _worst(r) else ""
    if r["state"] == PASS:
        return f"<td>{_badge(PASS)}{worst}</td>"
    err = (r.get("error") or "").strip()
    first = _LOCATION.sub("", err.splitlines()[0]) if err else "(no message)"
    meta = (f"worst error: {_worst(r) or 'none measured'} · mode {r.get('mode')} · seed {r.get('seed')}"
            f" · {r.get('duration') or 0.0:.2f} s")
    return (f"<td><details><summary>{_badge(r['state'])}{worst} <span class=\"snip\">{e(first)}</span></summary>"
            f"<pre>{e(err or '(no message)')}</pre><div class=\"meta\">{e(meta)}</div></details></td>")


def _html(runs: list, ids: list) -> str:
    e = _h
    cols = [column(m) for m, _ in runs]
    present = [s for s in SEVERITY if any(r["state"] == s for _, res in runs for r in res.values())]
    out = ["<!doctype html><html lang=\"en\"><meta charset=\"utf-8\">",
           "<meta name=\"viewport\" content=\"width=device-width\">",
           f"<title>tilecore conformance: {e(', '.join(cols))}</title><style>{_CSS}</style><body>",
           "<h1>tilecore conformance</h1>",
           f"<div class=\"sub\">{len(ids)} cases &middot; {len(runs)} run(s) &middot; written "
           f"{e(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))}</div>"]
    out += [f"<div class=\"banner {k}\">{e(t)}</div>" for k, t in _banners(runs)]
    # runs: verdict, totals per state, and what ran where: one row per target and mode
    out.append("<h2>Runs</h2><table class=\"runs\"><thead><tr><th>run</th><th>verdict</th><th>totals</th>"
               "<th>device</th><th>backend</th><th>versions</th><th>created</th><th>selection</th></tr></thead><tbody>")
    for man, res in runs:
        counts = Counter(r["state"] for r in res.values())
        ok = _verdict(man, res)
        totals = " ".join(f"<span class=\"tot\">{_badge(s)} {counts[s]}</span>" for s in SEVERITY if counts[s])
        versions = [f"tilecore {man.get('core_version', '?')}", f"conformance {man.get('conformance_version', '?')}"]
        versions += [man["toolchain"]] if man.get("toolchain") else []
        backend = e(_backend(man))
        if man.get("capability_profile"):
            backend += f"<br>profile {e(man['capability_profile'])}"
        out.append(f"<tr><td class=\"nw\"><b>{e(column(man))}</b></td>"
                   f"<td class=\"{'v-pass' if ok else 'v-fail'}\">{'pass' if ok else 'FAIL'}</td>"
                   f"<td>{totals or 'no results'}<br><span class=\"num\">{len(res)} cases</span></td>"
                   f"<td>{e(_device(man))}</td><td>{backend}</td><td>{'<br>'.join(e(v) for v in versions)}</td>"
                   f"<td class=\"nw\">{e(man.get('created', '').replace('T', ' '))}</td>"
                   f"<td>{e(selection_text(man))}</td></tr>")
    out.append("</tbody></table>")
    # controls
    rows_with = Counter(s for cid in ids for s in {res[cid]["state"] for _, res in runs if cid in res})
    out.append("<h2>Cases</h2><div id=\"bar\"><input id=\"q\" type=\"search\" "
               "placeholder=\"filter by case id or error text\" aria-label=\"filter\"><span id=\"states\">")
    out += [f"<label title=\"cases with {s} in some run\"><input type=\"checkbox\" value=\"{s}\" checked> "
            f"{_badge(s)} {rows_with[s]}</label> " for s in present]
    out.append("</span><button id=\"problems\">problems only</button><button id=\"all\">show all</button>"
               "<label><input type=\"checkbox\" id=\"ff\" checked> failures first</label>"
               "<button id=\"open\">open details</button><span id=\"shown\"></span></div>")
    # the cases, failures first (the page is ordered so without JavaScript too)
    out.append("<table id=\"cases\"><colgroup><col class=\"id\">" + "<col>" * len(cols) + "</colgroup>"
               "<thead><tr><th>case</th>" + "".join(f"<th>{e(c)}</th>" for c in cols)
               + "</tr></thead><tbody>")
    alpha = {cid: i for i, cid in enumerate(ids)}
    for cid in sorted(ids, key=lambda i: (_rank(runs, i), i)):
        states = sorted({res[cid]["state"] for _, res in runs if cid in res})
        out.append(f"<tr data-s=\"{' '.join(states)}\" data-r=\"{_rank(runs, cid)}\" data-i=\"{alpha[cid]}\">"
                   f"<td>{e(cid)}</td>" + "".join(_cell(res.get(cid)) for _, res in runs) + "</tr>")
    out.append(f"</tbody></table><script>{_JS}</script></body></html>\n")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ merging

def read_run(d: Path) -> list:
    """The runs of a report folder: one for a run, several for a folder that ``merge`` wrote."""
    mpath, rpath = d / "manifest.json", d / "results.jsonl"
    if not (mpath.is_file() and rpath.is_file()):
        raise SystemExit(f"tilecore: error: {d} is not a conformance report folder (it lacks manifest.json or "
                         "results.jsonl) (fix: pass folders written by `tilecore conformance run --report DIR`)")
    try:
        man = json.loads(mpath.read_text())
        records = [json.loads(x) for x in rpath.read_text().splitlines() if x.strip()]
    except ValueError as err:
        raise SystemExit(f"tilecore: error: {d} holds a damaged report ({err}) (fix: run it again)") from None
    if "runs" not in man:
        return [(man, {r["id"]: r for r in records})]
    return [(m, {r["id"]: r for r in records if (r["target"], r["mode"]) == (m["target"], m["mode"])})
            for m in man["runs"]]


def merge(dirs: list, out: Path) -> None:
    runs = [run for d in dirs for run in read_run(Path(d))]
    cols = [column(m) for m, _ in runs]
    dup = {c for c in cols if cols.count(c) > 1}
    if dup:
        raise SystemExit(f"tilecore: error: several runs for {sorted(dup)} (fix: merge one run per target and mode)")
    out.mkdir(parents=True, exist_ok=True)
    records = sorted((r for _, res in runs for r in res.values()), key=lambda r: (r["target"], r["mode"], r["id"]))
    _write_results(out / "results.jsonl", records)
    man = {**_base(), "merged_from": [str(d) for d in dirs], "runs": [m for m, _ in runs], "cases": len(records),
           "counts": {column(m): dict(Counter(r["state"] for r in res.values())) for m, res in runs},
           "results_sha256": _sha256(out / "results.jsonl")}
    (out / "manifest.json").write_text(json.dumps(man, indent=2, sort_keys=True))
    write_junit(out / "junit.xml", runs)
    write_matrix(out, runs)
