"""Stopping a run early: SIGINT, SIGTERM, or a reader of our output that went away.

Semantics: docs/conformance.md#isolation ("Stopping"). A ``StopSwitch`` is the runner's one
stop flag: the signal handlers it installs (``interruptible``, from the main thread) and a closed
stdout/stderr pipe (``check_outputs``) set it; worker requests (conformance/run/workerproc.py, its
``cancel`` event) and the runner's loops read it. ``RunInterrupted`` is what a stopped run raises.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import threading

__all__ = ["RunInterrupted", "StopSwitch", "closed_outputs", "describe_stop"]


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped (SIGINT, SIGTERM, or SIGPIPE: the reader of our output went away) before its
    last case: ``signum`` says by what, ``results`` holds what finished (each also in results.jsonl);
    the exit status is 128 + signum (docs/conformance.md#exit-status)."""

    def __init__(self, signum: int, results: "list | None" = None):
        super().__init__(describe_stop(signum))
        self.signum = signum
        self.results = results or []


def describe_stop(signum: int) -> str:
    if signum == signal.SIGPIPE:
        return "the reader of the output went away (SIGPIPE)"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def closed_outputs(fds=(1, 2)) -> list:
    """Those of ``fds`` (stdout, stderr) that are pipes whose reader has gone (`qconform run | head -1`)."""
    out = []
    for fd in fds:
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            poll = select.poll()
            poll.register(fd, select.POLLOUT)
            if any(ev & select.POLLERR for _, ev in poll.poll(0)):
                out.append(fd)
        except (OSError, ValueError, AttributeError):  # (no poll on this platform: never "closed")
            continue
    return out


class StopSwitch:
    """The stop flag of one run (thread-safe). ``event`` is set once stopped; ``stopped_by`` is the
    signal that stopped it (``signal.SIGPIPE`` for a closed output), None when not stopped by one."""

    def __init__(self):
        self.event = threading.Event()
        self.stopped_by: "int | None" = None
        self._handlers = None

    def stop(self, signum: "int | None" = signal.SIGINT) -> None:
        """No new case starts; each pending worker request kills its worker. ``signum=None``: stopped by an
        error (an unwritable folder), which the caller raises itself."""
        if self.stopped_by is None and signum is not None:
            self.stopped_by = int(signum)
        self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def check_outputs(self) -> None:
        if self.stopped_by is None and closed_outputs():
            self.stop(signal.SIGPIPE)

    def _on_signal(self, signum, _frame) -> None:
        if self.stopped_by is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the cleanup
        self.stop(signum)

    @contextlib.contextmanager
    def interruptible(self):
        """SIGINT and SIGTERM stop the run (instead of raising in whatever the main thread runs) while the
        block runs; nested uses, and threads other than the main one, change nothing."""
        if self._handlers is not None or threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in self._handlers.items():
                signal.signal(sig, old)
            self._handlers = None
