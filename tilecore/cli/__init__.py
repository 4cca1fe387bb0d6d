"""The ``tilecore`` command line.

    tilecore --version
    tilecore targets list [--json]
    tilecore targets show TARGET [--json]
    tilecore compile FILE.py:NAME --target T --emit ir|lowered|source [--args 1024,1024,64]
    tilecore capabilities validate [PATH ...]
    tilecore cache dir | clear
    tilecore conformance run --target T [-n auto] [--report DIR] [-k EXPR]   (with tilecore-conformance)
    tilecore conformance merge DIR... --out DIR

Starts fast: nothing heavier than the plugin registry loads unless a command needs it.
"""
from __future__ import annotations

import argparse
import json
import sys

from .._version import __version__


def _console():
    """rich output; not wrapped at all when stdout is not a terminal (a file, a pipe), so tables keep
    whole names in every cell."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(soft_wrap=True)
    return Console(soft_wrap=True, width=100_000)


def _plugin_api() -> str:
    from ..plugin import PLUGIN_API

    return f"{PLUGIN_API[0]}.{PLUGIN_API[1]}"


# -- targets --------------------------------------------------------------------------------------

def _target_rows() -> list:
    from ..plugin import get_registry
    from ..plugin.capabilities import capability_registry

    reg = get_registry()
    rows = []
    for rec in reg.plugins():
        if rec.status != "ok":
            rows.append({"target": "-", "plugin": rec.name, "distribution": rec.distribution or "?",
                         "version": rec.version or "?", "plugin_api": "?", "status": rec.status_text,
                         "devices": [], "profile": "-"})
            continue
        for b in rec.backends:
            try:
                probe = b.probe()
                status, devices = probe.status, [d.name for d in probe.devices]
            except Exception as e:  # noqa: BLE001 - a probe failure is reported, never fatal to the listing
                status, devices = f"broken: probe raised {type(e).__name__}: {e}", []
            for t in b.targets():
                _, tgt = reg.resolve(t)
                try:
                    profile = capability_registry().resolve(tgt.capability_id).id
                except Exception as e:  # noqa: BLE001
                    profile = f"invalid ({e})".splitlines()[0]
                    status = "broken: capability profile does not load"
                rows.append({"target": t, "plugin": rec.name, "distribution": b.distribution, "version": b.version(),
                             "plugin_api": b.plugin_api, "status": status, "devices": devices, "profile": profile})
    return rows


def cmd_targets_list(args) -> int:
    rows = _target_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title=f"tilecore {__version__} targets (plugin API {_plugin_api()})")
    for col in ("target", "distribution", "version", "plugin API", "status", "devices", "capability profile"):
        table.add_column(col, overflow="fold")
    style = {"ok": "green", "no-device": "yellow", "no-toolchain": "yellow"}
    for r in rows:
        st = r["status"]
        table.add_row(r["target"], r["distribution"], r["version"], r["plugin_api"],
                      f"[{style.get(st, 'red')}]{st}[/]", ", ".join(r["devices"]) or "-", r["profile"])
    con = _console()
    con.print(table)
    if not rows:
        con.print("[red]no backends installed[/]: pip install tilecore-cpu (or another tilecore-<vendor>)")
    return 0


def cmd_targets_show(args) -> int:
    import yaml

    from ..capabilities import compare_probe
    from ..plugin import get_registry, profile_for

    backend, tgt = get_registry().resolve(args.target)
    caps = profile_for(tgt)
    probe = backend.probe()
    mismatches = compare_probe(caps, probe.capabilities) if probe.capabilities else []
    info = {
        "target": str(tgt), "backend": backend.name, "distribution": backend.distribution,
        "version": backend.version(), "plugin_api": backend.plugin_api,
        "status": probe.status, "detail": probe.detail, "toolchain": probe.toolchain,
        "devices": [{"name": d.name, "index": d.index, **d.properties} for d in probe.devices],
        "capability_profile": caps.id, "capability_hash": caps.hash(), "sources": list(caps.sources),
        "probed": probe.capabilities, "mismatches": mismatches, "capabilities": caps.to_dict(),
    }
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 1 if mismatches else 0
    con = _console()
    con.print(f"[bold]{tgt}[/]  backend {backend.name} ({backend.distribution} {backend.version()}), "
              f"plugin API {backend.plugin_api}")
    con.print(f"status: {probe.status}" + (f" ({probe.detail})" if probe.detail else ""))
    if probe.toolchain:
        con.print(f"toolchain: {probe.toolchain}")
    for d in probe.devices:
        con.print(f"device {d.index}: {d.name} {d.properties}")
    con.print(f"capability profile: {caps.id} (hash {caps.hash()})")
    print(yaml.safe_dump(caps.to_dict(), sort_keys=False), end="")
    for m in mismatches:
        con.print(f"[red]{m}[/]")
    return 1 if mismatches else 0


# -- compile --------------------------------------------------------------------------------------

def _top_level_names(tree) -> set | None:
    """Names the module's top level may bind, read from its syntax tree (names bound under ``if``,
    ``try``, ``with`` or a loop count too); None when only running it tells (``from x import *``)."""
    import ast

    names = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return None
                names.add(a.asname or a.name.split(".")[0])
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    todo.append(child)
                elif isinstance(child, ast.excepthandler):
                    todo.extend(child.body)
                    names.update([child.name] if child.name else [])
            targets = {ast.Assign: "targets", ast.AnnAssign: "target", ast.AugAssign: "target",
                       ast.For: "target", ast.With: "items", ast.NamedExpr: "target"}
            if type(node) in targets:
                for n in ast.walk(node):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        names.add(n.id)
    return names


def _user_line(exc: BaseException, path) -> str:
    """``file:line`` of the deepest frame of ``exc`` in the user's file, or the file alone."""
    import traceback

    where = str(path)
    for fr in traceback.extract_tb(exc.__traceback__):
        if fr.filename == str(path):
            where = f"{path}:{fr.lineno}"
    return where


def _load_object(spec: str):
    import ast
    import importlib.util
    from pathlib import Path

    from ..errors import TilecoreError

    if ":" not in spec:
        raise SystemExit(f"tilecore compile: expected FILE.py:NAME, got {spec!r} (fix: e.g. kernels.py:matmul)")
    path, name = spec.rsplit(":", 1)
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"tilecore compile: {path} does not exist (fix: give the path of a .py file)")
    try:
        tree = ast.parse(p.read_text(), str(p))
    except SyntaxError as e:
        raise SystemExit(f"tilecore compile: {p}:{e.lineno}: SyntaxError: {e.msg}") from None
    names = _top_level_names(tree)
    if names is not None and name not in names:
        defined = ", ".join(sorted(n for n in names if not n.startswith("_"))) or "nothing"
        raise SystemExit(f"tilecore compile: {path} defines no top-level {name!r} (it defines: {defined}); "
                         "fix: name a @T.prim_func or a @tilecore.jit factory of that file")
    mod_spec = importlib.util.spec_from_file_location(p.stem, p)
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(p.parent.resolve()))
    try:
        mod_spec.loader.exec_module(module)
    except TilecoreError:
        raise  # a kernel error: main() prints it with the kernel's line
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's module failed: say where, no traceback
        raise SystemExit(f"tilecore compile: running {path} failed at {_user_line(e, p.resolve())}: "
                         f"{type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        raise SystemExit(f"tilecore compile: {path} has no {name!r} after running it")
    return getattr(module, name)


def _parse_args(text: str | None) -> tuple:
    import ast

    if not text:
        return ()
    try:
        value = ast.literal_eval(text if text.strip().startswith(("(", "[")) else f"({text},)")
    except (ValueError, SyntaxError):
        raise SystemExit(f"tilecore compile: --args {text!r} is not a list of Python literals "
                         "(fix: e.g. --args 1024,1024,'float16')") from None
    return tuple(value)


def _call_factory(factory, spec: str, text: str | None):
    """Call a kernel factory with --args, checking the count against its signature first."""
    import inspect

    args = _parse_args(text)
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return factory(*args)
    try:
        sig.bind(*args)
    except TypeError as e:
        given = f"--args {text}" if text else "no --args"
        raise SystemExit(f"tilecore compile: {spec} takes {factory.__name__}{sig}; {given} does not fit "
                         f"({e}); fix: give one value per parameter without a default, in order") from None
    from pathlib import Path

    from ..errors import TilecoreError

    try:
        return factory(*args)
    except TilecoreError:
        raise  # a kernel error: main() prints it with the kernel's line
    except Exception as e:  # noqa: BLE001 - the user's factory failed: say where, no traceback
        where = _user_line(e, Path(spec.rsplit(":", 1)[0]).resolve())
        raise SystemExit(f"tilecore compile: {factory.__name__}({text or ''}) failed at {where}: "
                         f"{type(e).__name__}: {e}") from None


def cmd_compile(args) -> int:
    from ..autotuner import AutoTuner
    from ..compiler import _JitFunction, lower
    from ..ir import PrimFunc

    obj = _load_object(args.spec)
    if isinstance(obj, AutoTuner):  # compile one config: the factory's defaults or those in --args
        obj = obj.jit_fn
    if isinstance(obj, _JitFunction):
        func = _call_factory(obj.factory, args.spec, args.args)
    elif isinstance(obj, PrimFunc):
        if args.args:
            raise SystemExit("tilecore compile: --args is for @tilecore.jit factories; NAME is a prim_func")
        func = obj
    elif callable(obj):
        func = _call_factory(obj, args.spec, args.args)
    else:
        raise SystemExit(f"tilecore compile: {args.spec} is neither a @T.prim_func nor a @tilecore.jit factory")
    if not isinstance(func, PrimFunc):
        raise SystemExit(f"tilecore compile: {args.spec} did not produce a @T.prim_func")
    if args.emit == "ir":
        out = func.script()
    else:
        backend, tgt, lowered, source, options = lower(func, args.target, _configs(args.config))
        if args.emit == "lowered":
            out = lowered.script()
        elif args.emit == "source":
            out = source.code
        else:
            emit_asm = getattr(backend, "disassemble", None)
            if emit_asm is None:
                raise SystemExit(f"tilecore compile: backend {backend.name} cannot show assembly (--emit asm)")
            out = emit_asm(backend.runtime(tgt).build(source, options), tgt)
    if args.output:
        from pathlib import Path

        Path(args.output).write_text(out)
    else:
        sys.stdout.write(out)
    return 0


def _configs(items) -> dict:
    out = {}
    for item in items or []:
        k, _, v = item.partition("=")
        try:
            import ast

            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k] = v
    return out


# -- capabilities, cache ----------------------------------------------------------------------------

def cmd_capabilities_validate(args) -> int:
    from pathlib import Path

    from ..capabilities import CapabilityError, CapabilityRegistry
    from ..plugin import get_registry

    for p in args.paths or []:
        if not Path(p).exists():
            raise CapabilityError("no such file or folder", file=p,
                                  hint="name a capability .yaml file or a folder that holds them")
    reg = CapabilityRegistry()
    n = shadowed = 0
    # Files named on the command line come first: where an installed backend carries a profile with the
    # same id (an installed copy of the checkout being validated), the named file is the one checked.
    for p in args.paths or []:
        path = Path(p)
        if path.is_dir():
            reg.add_directory(path)
            n += len([x for x in path.rglob("*.yaml") if x.name != "schema.yaml"])
        else:
            reg.add_file(path)
            n += 1
    for b in get_registry().backends().values():
        for f in b.capability_files():
            if reg.add_file(f, origin=b.distribution, if_absent=bool(args.paths)):
                n += 1
            else:
                shadowed += 1
    problems = reg.validate_all()
    con = _console()
    for msg in problems:
        con.print(f"[red]error[/] {msg}")
    note = f" ({shadowed} installed file(s) shadowed by the named paths)" if shadowed else ""
    con.print(f"{n} file(s), {len(reg.ids())} profile(s){note}: "
              + ("[green]all valid[/]" if not problems else f"[red]{len(problems)} problem(s)[/]"))
    return 1 if problems else 0


def cmd_cache(args) -> int:
    from ..compiler import cache

    if args.action == "dir":
        root, problem = cache.check_root(create=False)
        print(root)
        if problem:
            print(f"tilecore: warning: this cache is not used: {problem}", file=sys.stderr)
    else:
        n = cache.clear()
        print(f"removed {n['kernels']} cached kernel(s), {n['autotune']} autotune result(s) and "
              f"{n['launchers']} compiled launcher build(s) from {cache.cache_root()}")
    return 0


# -- entry --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilecore", description="tilecore: a tile-kernel compiler with vendor backends as plugins.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="kernels are written in Python (docs/language.md):\n"
               "  tilecore.compile(func, target=...)   compile a @T.prim_func\n"
               "  @tilecore.jit                        a kernel factory, compiled once per arguments\n"
               "  @tilecore.autotune(configs=[...])    time each config of a @tilecore.jit factory, keep the\n"
               "                                       fastest (remembered in the cache; `tilecore cache clear`\n"
               "                                       forgets it)")
    p.add_argument("--version", action="version", version=f"tilecore {__version__} (plugin API {_plugin_api()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("targets", help="list installed targets or show one target's capabilities")
    tsub = t.add_subparsers(dest="action", metavar="ACTION")
    tl = tsub.add_parser("list", help="one row per target: distribution, version, status, devices, profile")
    tl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tl.set_defaults(fn=cmd_targets_list)
    ts = tsub.add_parser("show", help="the resolved capability matrix, probe results and mismatches")
    ts.add_argument("target", help="a target string, e.g. cpu")
    ts.add_argument("--json", action="store_true", help="print JSON (target, probe, devices, mismatches, the "
                    "resolved capabilities) instead of text")
    ts.set_defaults(fn=cmd_targets_show)

    c = sub.add_parser("compile", help="compile a kernel from a Python file and print IR or source",
                       description="Compile FILE.py:NAME, where NAME is a @T.prim_func or a @tilecore.jit "
                       "factory (give its arguments with --args).")
    c.add_argument("spec", metavar="FILE.py:NAME")
    c.add_argument("--target", default="cpu", help="target string (default: cpu)")
    c.add_argument("--emit", choices=("ir", "lowered", "source", "asm"), default="source",
                   help="ir: the parsed tile IR; lowered: IR after the pass pipeline; source: generated code; "
                        "asm: the backend's disassembly, where it has one")
    c.add_argument("--args", help="factory arguments as Python literals, e.g. 1024,1024,1024,128,128,32")
    c.add_argument("--config", action="append", metavar="KEY=VALUE", help="a pass config (repeatable)")
    c.add_argument("-o", "--output", help="write to this file instead of stdout")
    c.set_defaults(fn=cmd_compile)

    cap = sub.add_parser("capabilities", help="capability matrices")
    capsub = cap.add_subparsers(dest="action", metavar="ACTION")
    cv = capsub.add_parser("validate", help="validate every installed capability file (and PATHs)")
    cv.add_argument("paths", nargs="*", help="extra files or folders to validate")
    cv.set_defaults(fn=cmd_capabilities_validate)

    try:  # the conformance suite is its own distribution; its commands appear when it is installed
        import importlib

        importlib.import_module("tilecore_conformance.cli").add_commands(sub)
    except ImportError:
        conf = sub.add_parser("conformance", help="(not installed: pip install tilecore-conformance)",
                              description="The conformance suite is not installed: pip install tilecore-conformance")
        # take whatever follows (`run --target cpu -n 2`), so the user sees which package to install,
        # not argparse's "unrecognized arguments"
        conf.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        conf.set_defaults(fn=lambda a: _missing_conformance())

    k = sub.add_parser("cache", help="the cache of compiled kernels and autotune results",
                       description="The on-disk cache ($TILECORE_CACHE_DIR, else $XDG_CACHE_HOME/tilecore, else "
                       "~/.cache/tilecore). Its entries are native code: it is created private (0700) and a "
                       "directory that other users can write is not used.")
    k.add_argument("action", choices=("dir", "clear"), help="dir: print the cache directory; clear: delete "
                   "every compiled kernel and autotune result in it (the next autotune times its configs again)")
    k.set_defaults(fn=cmd_cache)
    return p


def _missing_conformance() -> int:
    print("tilecore: error: the conformance suite is not installed; pip install tilecore-conformance "
          "(in this repository: pip install -e conformance)", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    """Run one command. Errors are one line on stderr (``tilecore: error: ...``), never a traceback
    (set TILECORE_TRACEBACK=1 to see one); output cut short by a closed pipe (``| head``) ends quietly."""
    import os

    from ..capabilities import CapabilityError
    from ..errors import TilecoreError

    parser = build_parser()
    args = parser.parse_args(argv)
    fn = getattr(args, "fn", None)
    if fn is None:
        parser.print_help()
        return 2
    try:
        rc = fn(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at interpreter exit
        return rc
    except BrokenPipeError:
        # the reader went away (`tilecore ... | head`): stop like other unix tools, without a message;
        # stdout now points at /dev/null so that the interpreter's final flush does not complain
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130
    except (TilecoreError, CapabilityError) as e:
        _fail(str(e))
        return 1
    except OSError as e:
        if os.environ.get("TILECORE_TRACEBACK"):
            raise
        what = f"{e.filename}: " if e.filename else ""
        _fail(f"{what}{e.strerror or e} (fix: check that the path exists and can be read)")
        return 1
    except Exception as e:  # noqa: BLE001 - a bug in tilecore or a plugin: one line, the traceback on request
        if os.environ.get("TILECORE_TRACEBACK"):
            raise
        _fail(f"internal error: {type(e).__name__}: {e} (this is a bug; rerun with TILECORE_TRACEBACK=1 and "
              "report the traceback)")
        return 1


def _fail(message: str) -> None:
    first, *rest = message.strip().splitlines() or [""]
    print(f"tilecore: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line.strip()}", file=sys.stderr)
