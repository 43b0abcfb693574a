"""The runner's side of a backend worker (conformance/run/worker.py): start, ask, time out, kill.

Semantics: docs/conformance.md#isolation. Requests and replies travel on two pipes of their own
(not the worker's fds 0, 1 or 2, which go to /dev/null and the worker's log): whatever a kernel
prints cannot be taken for a reply. Every wait for a reply is bounded by the case timeout, also
when the worker sends half a line and hangs, and ends early when the run is stopped (``cancel``).
The worker's fds 1 and 2 are one pipe that a thread here reads, keeping the first ``LOG_HEAD`` and
the last ``LOG_KEEP`` bytes: a kernel that floods stderr costs the runner no disk and no memory.
The worker runs in its own session and is a child subreaper (Linux): a timeout, a crash and
``close`` freeze and kill everything it started (its process group, its session, its descendants,
and any process carrying its token in the environment), so no process a kernel starts, setsid()
ones included, outlives the worker.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["WorkerProcess", "DEFAULT_MEMORY_LIMIT", "parse_size", "signal_name"]

MAX_REPLY = 1 << 20  # a reply line longer than this is not the worker speaking the protocol
LOG_TAIL = 600  # characters of the worker's log kept in a crash/timeout record
LOG_KEEP = 64 << 10  # a kept log holds the last 64 KiB of what the worker wrote ...
LOG_HEAD = 16 << 10  # ... and its first 16 KiB (the bytes between are counted, not kept)
TOKEN_VAR = "QCONFORM_WORKER_TOKEN"  # in every worker's environment: finds what it started, wherever it went


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


#: per worker: half the host's memory (at least 2 GiB), so one runaway kernel meets its cap (MemoryError or
#: a failed allocation: a crash verdict) before the host's OOM killer picks a victim
DEFAULT_MEMORY_LIMIT = max(2 << 30, _physical_memory() // 2)


def parse_size(text) -> int:
    """'8G', '512M', '1.5G', '0' (no cap) or a byte count -> bytes."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        value = int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(float(t))
    except (ValueError, OverflowError):
        value = -1
    if value < 0:
        raise ValueError(f"--memory-limit: expected a size such as 8G, 512M or 0 (no cap), got {text!r}")
    return value


def signal_name(rc: int) -> "str | None":
    if rc is None or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _describe_exit(rc: int) -> str:
    sig = signal_name(rc)
    return f"killed by signal {sig}" if sig else f"exited with status {rc}"


_counter = itertools.count(1)


class WorkerProcess:
    """One backend worker subprocess with line-JSON requests on a private channel and a per-request timeout.

    ``log_dir``: where the worker's log (its fds 1 and 2) is kept when the worker crashed or timed
    out (its first ``LOG_HEAD`` and last ``LOG_KEEP`` bytes, with the count of the bytes between);
    a worker that ends cleanly leaves no file. ``last_log`` names the kept log. ``cancel``: an
    event that, once set, makes a pending request kill the worker and answer ``kind: interrupted``.
    """

    def __init__(self, backend_spec: str, *, env: dict | None = None, log_dir: "str | Path | None" = None,
                 memory_limit: "int | None" = None, cancel: "threading.Event | None" = None):
        self.backend_spec = backend_spec
        self.env = env
        self.log_dir = Path(log_dir) if log_dir else None
        self.memory_limit = DEFAULT_MEMORY_LIMIT if memory_limit is None else int(memory_limit)
        self.cancel = cancel
        self.proc: subprocess.Popen | None = None
        self.log_path: "Path | None" = None
        self.last_log: "Path | None" = None
        self._log: "_LogCollector | None" = None
        self._token = ""
        self._req = self._rep = None
        self._buf = b""
        self.last_tail = ""  # the end of the last log, read when the worker was killed
        self.reaped: list[int] = []  # pids besides the worker that the last kill ended (tests)

    def start(self) -> None:
        n = next(_counter)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.backend_spec)[:60]
        self.log_path = self.log_dir / f"worker-{safe}-{os.getpid()}-{n}.log" if self.log_dir is not None else None
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        from conformance.cases.golden import GOLDEN_DIR

        env.setdefault("QCONFORM_GOLDEN_DIR", str(GOLDEN_DIR))  # the worker's cwd differs from ours
        self._token = f"{os.getpid()}-{n}-{os.urandom(6).hex()}"
        env[TOKEN_VAR] = self._token
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        log_r, log_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                _worker_command() + ["--backend", self.backend_spec, "--request-fd", str(req_r), "--reply-fd",
                                     str(rep_w), "--memory-limit", str(self.memory_limit)],
                stdin=subprocess.DEVNULL, stdout=log_w, stderr=log_w, pass_fds=(req_r, rep_w), env=env, cwd=root,
                start_new_session=True)
        except BaseException:
            for fd in (req_w, rep_r, log_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
            os.close(log_w)
        self._log = _LogCollector(log_r)
        self._log.start()
        self._req, self._rep = req_w, rep_r
        os.set_blocking(rep_r, False)
        os.set_blocking(req_w, False)  # a worker that stops reading cannot block the runner's write
        self._buf = b""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = LOG_TAIL) -> str:
        """The last ``n`` bytes of the worker's log (as the kept file ends), decoded and stripped."""
        if self._log is None:
            return self.last_tail
        return _tail_text(self._log.text(), n)

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def request(self, obj: dict, timeout: float) -> dict:
        """Send one request; returns the reply, or {"ok": False, "kind": "crash"|"timeout"|"interrupted", ...}."""
        if self._cancelled():
            return self._interrupted()
        if not self.alive():
            self.kill(keep_log=False)
            self.start()
        deadline = time.monotonic() + timeout
        data = (json.dumps(obj) + "\n").encode()
        try:
            while data:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._timeout(timeout)
                if self._cancelled():
                    return self._interrupted()
                _, w, _ = select.select([], [self._req], [], min(left, 0.2))
                if w:
                    try:
                        data = data[os.write(self._req, data):]
                    except BlockingIOError:
                        continue
                elif self.proc.poll() is not None:
                    return self._dead()
        except OSError:
            return self._dead()
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl], self._buf[nl + 1:]
                try:
                    reply = json.loads(line)
                    if not isinstance(reply, dict):
                        raise ValueError("not an object")
                    return reply
                except ValueError:
                    return self._dead(f"the worker broke the reply protocol (a line that is not a JSON object: "
                                      f"{line[:120]!r})")
            if len(self._buf) > MAX_REPLY:
                return self._dead(f"the worker broke the reply protocol (a reply longer than {MAX_REPLY} bytes)")
            left = deadline - time.monotonic()
            if left <= 0:
                return self._timeout(timeout)
            if self._cancelled():
                return self._interrupted()
            r, _, _ = select.select([self._rep], [], [], min(left, 0.2))
            if r:
                try:
                    chunk = os.read(self._rep, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return self._dead()
                self._buf += chunk
            elif self.proc.poll() is not None:
                return self._dead()  # (a forked child may still hold the reply pipe open: no EOF comes)

    def _interrupted(self) -> dict:
        self.kill(keep_log=False)
        return {"ok": False, "kind": "interrupted", "error": "the run was stopped; the worker was killed"}

    def _timeout(self, timeout: float) -> dict:
        self.kill(keep_log=True)
        tail = self.last_tail
        return {"ok": False, "kind": "timeout", "error": f"no answer within {timeout:g} s; worker killed",
                "evidence": {"worker": "timeout", "timeout_s": timeout, "log": self._log_name(), "log_tail": tail}}

    def _dead(self, why: "str | None" = None) -> dict:
        rc = None
        if self.proc is not None:
            if why is None:
                try:
                    rc = self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    why = "the worker closed its reply channel but did not exit"
        self.kill(keep_log=True)
        tail = self.last_tail
        what = why or _describe_exit(rc)
        return {"ok": False, "kind": "crash", "error": what + (f"; log: {tail}" if tail else ""), "returncode": rc,
                "evidence": {"worker": "crash", "returncode": rc, "signal": signal_name(rc) if rc is not None else None,
                             "what": what, "log": self._log_name(), "log_tail": tail}}

    def _log_name(self) -> "str | None":
        if self.last_log is None or self.log_dir is None:
            return None
        return self.last_log.name

    def kill(self, *, keep_log: bool = False) -> None:
        """Kill the worker and everything it started, close the channel; keep (head and tail) or drop its log."""
        if self.proc is not None:
            self.reaped = _kill_tree(self.proc, self._token)
            self.proc = None
        for fd in (self._req, self._rep):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._req = self._rep = None
        self._buf = b""
        if self._log is not None:
            self._log.finish()
            data = self._log.text()
            self._log = None
            self.last_tail = _tail_text(data, LOG_TAIL)
            self.last_log = None
            if keep_log and self.log_path is not None:
                try:
                    self.log_path.parent.mkdir(parents=True, exist_ok=True)
                    self.log_path.write_bytes(data)
                    self.last_log = self.log_path
                except OSError:  # a full disk: the record keeps the excerpt; the run's own writes say the rest
                    _remove(self.log_path)
        self.log_path = None

    def close(self) -> None:
        if self.alive() and not self._cancelled():
            try:
                self.request({"op": "exit"}, timeout=5)
            except Exception:  # noqa: BLE001
                pass
        self.kill(keep_log=False)


#: the worker as a child subreaper (Linux): what a kernel double-forks or setsid()s stays its descendant
_SUBREAPER_BOOT = ("import ctypes\n"
                   "try:\n"
                   "    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER\n"
                   "except Exception:\n"
                   "    pass\n"
                   "import runpy\n"
                   "runpy.run_module('conformance.run.worker', run_name='__main__', alter_sys=True)\n")


def _worker_command() -> list:
    if sys.platform.startswith("linux"):
        return [sys.executable, "-c", _SUBREAPER_BOOT]
    return [sys.executable, "-m", "conformance.run.worker"]


class _LogCollector(threading.Thread):
    """Reads a worker's fds 1 and 2 (one pipe): keeps the first LOG_HEAD and the last LOG_KEEP bytes."""

    def __init__(self, fd: int):
        super().__init__(daemon=True, name="qconform-worker-log")
        self.fd = fd
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self._stop_at: "float | None" = None
        self._mutex = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                r, _, _ = select.select([self.fd], [], [], 0.1)
            except (OSError, ValueError):
                return
            if r:
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                self._take(chunk)
            stop = self._stop_at
            if stop is not None and (not r or time.monotonic() > stop):
                return

    def _take(self, chunk: bytes) -> None:
        with self._mutex:
            room = LOG_HEAD - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail += chunk
            extra = len(self.tail) - LOG_KEEP
            if extra > 0:
                del self.tail[:extra]
                self.dropped += extra

    def finish(self) -> None:
        """Read what is left (at most a second more), then stop and close the pipe."""
        self._stop_at = time.monotonic() + 1.0
        self.join(timeout=3.0)
        if not self.is_alive():
            try:
                os.close(self.fd)
            except OSError:
                pass

    def text(self) -> bytes:
        with self._mutex:
            mid = (f"\n[qconform: {self.dropped} bytes of this log dropped here; kept the first {LOG_HEAD} "
                   f"and the last {LOG_KEEP}]\n".encode() if self.dropped else b"")
            return bytes(self.head) + mid + bytes(self.tail)


def _tail_text(data: bytes, n: int) -> str:
    return data[-n:].decode("utf-8", "replace").strip()


# -- ending a worker and everything it started ------------------------------------------------------------
def _proc_table() -> dict:
    """pid -> (ppid, pgid, sid) of every process in /proc (empty where there is no /proc)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            rest = stat[stat.rfind(b")") + 2:].split()
            out[int(name)] = (int(rest[1]), int(rest[2]), int(rest[3]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _has_token(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read()
    except OSError:
        return False


def _started_by(root: int, token: str) -> set:
    """Every process the worker ``root`` started: its process group and session, its descendants (it is a
    subreaper, so double-forked ones stay below it), and any process whose environment holds its token."""
    table = _proc_table()
    me = os.getpid()
    found = {p for p, (_, pgid, sid) in table.items() if pgid == root or sid == root}
    children: dict = {}
    for p, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    stack = [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in found:
                found.add(c)
                stack.append(c)
    if token:
        needle = f"{TOKEN_VAR}={token}".encode() + b"\0"
        found |= {p for p in table if p not in found and p != me and _has_token(p, needle)}
    found.discard(me)
    found.discard(root)
    return found


def _signal(pids, sig) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_tree(proc: subprocess.Popen, token: str) -> list:
    """SIGKILL the worker and what it started; returns the other pids it ended. Everything is stopped
    (SIGSTOP) first, so nothing can fork past the scan; the worker's pid stays reserved until its wait."""
    root = proc.pid
    others: set = set()
    running = proc.poll() is None  # (once reaped, its pid may belong to another process: never signalled)
    if running:
        _signal([root], signal.SIGSTOP)
    for _ in range(4):  # freeze, rescan: what forked between two scans is caught by the next
        new = _started_by(root, token) - others
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        others |= new
    try:
        os.killpg(root, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _signal(([root] if running else []) + sorted(others), signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for p in others:  # ours to reap where they were our children; init reaps the rest
        try:
            os.waitpid(p, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass
    return sorted(others)


def _remove(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass
