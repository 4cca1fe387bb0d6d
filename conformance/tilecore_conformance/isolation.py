"""Cases run in a child process, the case runner, fed case ids over a pipe, with a watchdog here.

Python cannot stop native code: a kernel that dereferences a bad pointer kills its process, and one that
spins in native code ignores every signal handler. So each pytest process (each xdist worker) starts one
case runner and sends it one case id at a time; the runner resolves the target once, runs the case and
answers with the result as one JSON line. Here, the parent:

- a runner that dies (SIGSEGV, abort, exit) records CRASH for the case it was running, with the signal
  and the runner's last words (faulthandler's report names the Python frame that was in native code);
- a runner that gives no answer within the case's timeout has its process group killed: TIMEOUT;
- either way, and also after a CRASH the runner reports itself (a device error such as an illegal
  address can poison the process's device context for every later case), the next case gets a fresh
  runner. Compiled kernels are cached on disk, so a fresh runner costs only its start-up.

The runner inherits the environment (``TILECORE_DEVICE`` included) and ``sys.path``; it dies with its
parent (Linux ``PR_SET_PDEATHSIG``) or when its pipe closes.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

from .model import CRASH, HARNESS_ERROR, TIMEOUT, Case, Result

#: seconds a runner may take to import tilecore and probe the target before the case's clock starts
STARTUP_TIMEOUT = 300.0


class RunnerError(Exception):
    """The case runner could not be started: an error of the harness, not of a case."""


class _Died(Exception):
    pass


class CaseRunner:
    """The parent's side: one runner process at a time, restarted after a crash or a kill."""

    def __init__(self, spec: str, name: str, mode: str, timeout: float):
        self.spec, self.name, self.mode, self.timeout = spec, name, mode, timeout
        self.proc: subprocess.Popen | None = None
        self.log = None  # the runner's stdout and stderr (kernels' prints, faulthandler reports)
        self.buf = b""
        self.broken = ""  # why the runner could not start: every later case gets it at once

    def run(self, case: Case, expected_fail: dict | None = None) -> Result:
        from .runner import apply_expectations, new_result

        res = new_result(case, self)
        start = time.perf_counter()
        try:
            if self.broken:
                raise RunnerError(self.broken)
            if self.proc is None:
                self._start()
                start = time.perf_counter()  # the case's clock starts when the runner is ready
            mark = os.fstat(self.log.fileno()).st_size
            self._send({"id": case.id})
            reply = self._receive(self.timeout)
            if reply is not None:  # the runner's own record, its duration included
                return apply_expectations(self._recycle(Result(**reply)), expected_fail)
            res.state, res.error = TIMEOUT, f"no result within {self.timeout:g} s: the case runner was killed"
        except _Died:
            status = self.proc.wait()
            res.state = CRASH
            res.error = f"the case runner died {describe_exit(status)} while running the case{self._last_words(mark)}"
        except RunnerError as e:
            res.state, res.error = HARNESS_ERROR, str(e)
        res.duration = round(time.perf_counter() - start, 4)
        return apply_expectations(self._recycle(res), expected_fail)

    def _recycle(self, res: Result) -> Result:
        """A runner that crashed, hung or reported a crash is not trusted with the next case."""
        if res.state in (CRASH, TIMEOUT):
            self.close()
        return res

    # -- the runner process ---------------------------------------------------------------------------
    def _start(self) -> None:
        self.log = tempfile.TemporaryFile(prefix="tilecore-case-runner-")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "tilecore_conformance.isolation", self.spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     start_new_session=True, env=env)
        self.buf = b""
        try:
            reply = self._receive(STARTUP_TIMEOUT)
        except _Died:
            self.broken = f"the case runner exited during start-up {describe_exit(self.proc.wait())}{self._last_words(0)}"
            self.close()
            raise RunnerError(self.broken) from None
        if reply is None or "error" in reply:
            self.close()
            self.broken = reply["error"] if reply else f"the case runner did not start within {STARTUP_TIMEOUT:g} s"
            raise RunnerError(self.broken)

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Died() from None

    def _receive(self, seconds: float) -> dict | None:
        """The runner's next JSON line, or None when none came within ``seconds``."""
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + seconds
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Died()
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def _last_words(self, mark: int) -> str:
        """What the runner wrote since ``mark``, cut to faulthandler's headline and innermost frame, or
        the last lines; '' when it wrote nothing."""
        if self.log is None:
            return ""
        self.log.seek(mark)
        lines = [x.strip() for x in self.log.read()[-20000:].decode(errors="replace").splitlines() if x.strip()]
        fatal = [x for x in lines if x.startswith("Fatal Python error")]
        frames = [x for x in lines if re.match(r'File ".*", line \d+ in ', x)]
        words = fatal[-1:] + frames[:1] if fatal else lines[-3:]
        return f"; last output: {' | '.join(words)}" if words else ""

    def close(self) -> None:
        """Stop the runner (its whole process group: compilers it started go too)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None


def describe_exit(status: int) -> str:
    if status < 0:
        try:
            return f"from signal {signal.Signals(-status).name}"
        except ValueError:
            return f"from signal {-status}"
    return f"with exit status {status}"


# -- the runner's side ----------------------------------------------------------------------------------
def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def main(spec: str) -> int:
    import faulthandler

    proto = os.fdopen(os.dup(1), "w")  # answers go here; fd 1 becomes the log, so kernels' prints
    os.dup2(2, 1)                       # cannot garble the protocol
    faulthandler.enable()
    _die_with_parent()

    def answer(msg: dict) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    try:
        from .catalog import catalog
        from .runner import Target, run_case

        target = Target(spec)
        cases = {c.id: c for c in catalog()}
    except Exception as e:  # noqa: BLE001 - reported to the parent as a harness error
        answer({"error": f"the case runner could not set up target {spec!r}: {type(e).__name__}: {e}"})
        return 1
    answer({"ready": True})
    for line in sys.stdin:
        case = cases[json.loads(line)["id"]]
        answer(run_case(case, target).to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
