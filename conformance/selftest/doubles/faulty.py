"""Deliberately faulty backends that test the suite itself (never real kernels).

They are not in the registry's default list: tests (and ``qconform selftest``)
register them with ``QCONFORM_EXTRA_BACKENDS="name=conformance.selftest.doubles.faulty:Class,..."``.
Each computes through the emulator and then misbehaves in one way real kernels
do: killing the process with a signal, hanging, or returning NaNs.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from backends.emulator import EmulatorBackend


class _Faulty(EmulatorBackend):
    covers = "a deliberately faulty test backend"
    priority = -1000

    def __init__(self, **params):
        only = params.pop("only", None)  # misbehave only for this scheme (others run normally)
        super().__init__(**params)
        self.only = only
        if only is not None:
            self.params["only"] = only  # part of the label

    def _triggered(self, prepared) -> bool:
        return self.only is None or prepared.case.scheme == self.only


class SegfaultBackend(_Faulty):
    name = "faulty-segfault"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(prepared, x, **inputs)


class AbortBackend(_Faulty):
    name = "faulty-abort"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.abort()
        return super().run(prepared, x, **inputs)


class HangBackend(_Faulty):
    name = "faulty-hang"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            time.sleep(3600)
        return super().run(prepared, x, **inputs)


class NanBackend(_Faulty):
    name = "faulty-nan"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        if self._triggered(prepared):
            y = np.full_like(y, np.nan)
        return y


class ZeroBackend(_Faulty):
    name = "faulty-zero"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return np.zeros_like(y) if self._triggered(prepared) else y


class RaiseBackend(_Faulty):
    name = "faulty-raise"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            raise RuntimeError("kernel reported an internal error")
        return super().run(prepared, x, **inputs)


class SequentialAccumulatorBackend(EmulatorBackend):
    """A16 linears accumulated one K term at a time in a chosen dtype (``acc=float32|float16|bfloat16``).

    Not faulty: an honest low-precision kernel model (it declares its accumulation dtype), used to
    check that ``qconform fingerprint`` brackets accumulation precision (tests/conformance/test_fingerprint.py).
    Products are formed exactly (float64) and each partial sum is rounded (RNE) to ``acc``.
    """

    name = "seq-acc"
    covers = "a sequential low-precision accumulator (test model, not a real kernel)"
    priority = -1000

    def __init__(self, **params):
        acc = params.pop("acc", "float32")
        if acc not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"seq-acc: acc must be float32, float16 or bfloat16, got {acc!r}")
        # claim=float32,opaque=true: declares fp32 accumulation under opaque arithmetic (as ARK's int8 cores do)
        claim = params.pop("claim", acc)
        opaque = str(params.pop("opaque", "false")).lower() in ("1", "true", "yes")
        super().__init__(**params)
        self.acc, self.claim, self.opaque = acc, claim, opaque
        self.params.update(acc=acc, claim=claim, opaque=opaque)

    def can_implement(self, case):
        from backends.base import no, yes

        return yes() if case.spec.activations == "a16" else no("A16 schemes only")

    def declared(self, case):
        import dataclasses

        d = dataclasses.replace(super().declared(case), accumulate=self.claim,
                                notes=f"sequential accumulation in {self.acc}")
        return dataclasses.replace(d, arithmetic="opaque", sqnr_floor_db=20.0) if self.opaque else d

    def run(self, prepared, x, **inputs):
        from conformance.judge.acceptance import declared_weight
        from emulator.numerics.floats import round_to_dtype

        case = prepared.case
        w = declared_weight(case, prepared.data["tensors"], self.computed(case)).astype(np.float64)
        x64 = np.asarray(x, np.float64)
        acc = np.zeros((x64.shape[0], w.shape[0]))
        for k in range(x64.shape[1]):
            acc = round_to_dtype(acc + x64[:, k:k + 1] * w[None, :, k], self.acc)
        if inputs.get("bias") is not None:
            acc = round_to_dtype(acc + np.asarray(inputs["bias"], np.float64), self.acc)
        return round_to_dtype(acc, case.output_dtype).astype(np.float32)


# -- malformed outputs: each must become that case's verdict, and the run goes on --------------------------
class WrongShapeBackend(_Faulty):
    """Drops the last output column."""

    name = "faulty-shape"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return y[:, :-1] if self._triggered(prepared) else y


class TransposedBackend(_Faulty):
    name = "faulty-transposed"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return np.ascontiguousarray(y.T) if self._triggered(prepared) else y


class ComplexBackend(_Faulty):
    """The right real part with an imaginary part: the output is not real."""

    name = "faulty-complex"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return y.astype(np.complex64) + 1j if self._triggered(prepared) else y


class NoneBackend(_Faulty):
    name = "faulty-none"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return None if self._triggered(prepared) else y


class ScalarBackend(_Faulty):
    name = "faulty-scalar"

    def run(self, prepared, x, **inputs):
        y = super().run(prepared, x, **inputs)
        return np.float32(y.sum()) if self._triggered(prepared) else y


# -- kernels that write to the worker's file descriptors ---------------------------------------------------
class PrintfBackend(_Faulty):
    """Writes to fd 1 from C (libc printf, flushed) and with os.write, then returns the right output."""

    name = "faulty-printf"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            import ctypes

            libc = ctypes.CDLL(None)
            libc.printf(b"kernel: tuning tile 128x64\n")
            libc.fflush(None)
            os.write(1, b"kernel says hello on fd 1 ")
            os.write(2, b"and on fd 2\n")
        return super().run(prepared, x, **inputs)


class JsonStdoutBackend(_Faulty):
    """Prints a line that looks like a protocol reply on fd 1 before answering."""

    name = "faulty-json-stdout"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.write(1, b'{"ok": true, "supported": false, "reason": ""}\n{"ok": true}\n')
        return super().run(prepared, x, **inputs)


class PartialLineHangBackend(_Faulty):
    """Writes half a JSON line on fd 1, then hangs."""

    name = "faulty-partial-hang"

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.write(1, b'{"ok": tr')
            time.sleep(3600)
        return super().run(prepared, x, **inputs)


# -- kernels that outgrow their process -----------------------------------------------------------------
class ForkBackend(_Faulty):
    """Forks a helper that sleeps for an hour (its pid appended to ``pidfile``), then answers correctly."""

    name = "faulty-fork"

    def __init__(self, **params):
        pidfile = params.pop("pidfile", None)
        super().__init__(**params)
        self.pidfile = pidfile

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            pid = os.fork()
            if pid == 0:  # the helper: sleeps on, holding every file descriptor of the worker
                try:
                    time.sleep(3600)
                finally:
                    os._exit(0)
            if self.pidfile:
                with open(self.pidfile, "a", encoding="utf-8") as f:
                    f.write(f"{pid}\n")
        return super().run(prepared, x, **inputs)


class MemoryHogBackend(_Faulty):
    """Allocates (and touches) ``gib`` GiB (default 64) before running: an OOM under any sane cap."""

    name = "faulty-memory-hog"

    def __init__(self, **params):
        gib = float(params.pop("gib", 64))
        super().__init__(**params)
        self.gib = gib

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            hog = np.ones(int(self.gib * (1 << 30)) // 8, np.float64)
            del hog
        return super().run(prepared, x, **inputs)


class RefuseAllBackend(_Faulty):
    """Refuses every case (``can_implement`` says no): a certification of it has nothing to certify."""

    name = "faulty-refuse-all"

    def can_implement(self, case):
        from backends.base import no

        return no("test: this backend implements nothing")


# -- runner robustness (issue 22): slow, noisy and escaping kernels ---------------------------------------
class SlowBackend(_Faulty):
    """Sleeps ``seconds`` (default 0.5) before each correct answer; appends its worker pid to ``pidfile``:
    a run long enough to interrupt, whose workers a test can look for afterwards."""

    name = "faulty-slow"

    def __init__(self, **params):
        self.seconds = float(params.pop("seconds", 0.5))
        pidfile = params.pop("pidfile", None)
        super().__init__(**params)
        self.pidfile = pidfile

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            if self.pidfile:
                with open(self.pidfile, "a", encoding="utf-8") as f:
                    f.write(f"{os.getpid()}\n")
            time.sleep(self.seconds)
        return super().run(prepared, x, **inputs)


class FloodBackend(_Faulty):
    """Writes ``mib`` MiB (default 64) to fd 2 (and a marker line first and last), then answers correctly
    or, with ``crash=true``, aborts: the runner must keep the log's head and tail, not the flood."""

    name = "faulty-flood"

    def __init__(self, **params):
        self.mib = float(params.pop("mib", 64))
        self.crash = str(params.pop("crash", "false")).lower() in ("1", "true", "yes")
        super().__init__(**params)

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            os.write(2, b"FLOOD-START\n")
            block = b"x" * 1023 + b"\n"
            for _ in range(int(self.mib * 1024)):
                os.write(2, block)
            os.write(2, b"FLOOD-END\n")
            if self.crash:
                os.abort()
        return super().run(prepared, x, **inputs)


class SetsidBackend(_Faulty):
    """Starts a daemon the classic way (fork, setsid, fork again, the middle process exits) that sleeps an
    hour; its pid goes to ``pidfile``. ``clean_env=true``: the daemon execs ``sleep`` with an empty
    environment (nothing of the worker's environment is left to find it by)."""

    name = "faulty-setsid"

    def __init__(self, **params):
        pidfile = params.pop("pidfile", None)
        self.clean_env = str(params.pop("clean_env", "false")).lower() in ("1", "true", "yes")
        super().__init__(**params)
        self.pidfile = pidfile

    def run(self, prepared, x, **inputs):
        if self._triggered(prepared):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the middle process
                try:
                    os.close(r)
                    os.setsid()
                    grandchild = os.fork()
                    if grandchild == 0:
                        os.close(w)
                        if self.clean_env:
                            os.execve("/bin/sleep", ["sleep", "3600"], {})
                        time.sleep(3600)
                        os._exit(0)
                    os.write(w, f"{grandchild}\n".encode())
                finally:
                    os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                daemon = f.read().strip()
            os.waitpid(pid, 0)
            if self.pidfile and daemon:
                with open(self.pidfile, "a", encoding="utf-8") as f:
                    f.write(f"{daemon}\n")
        return super().run(prepared, x, **inputs)
