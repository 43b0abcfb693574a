"""A test backend that stands for a GPU kernel library: it reads the device visibility variable a worker was
started with, and can lose its device mid-run (never a real kernel; docs/scaling.md).

Registered by tests with ``QCONFORM_EXTRA_BACKENDS="fake-device=conformance.selftest.doubles.devices:FakeDeviceBackend"``.
Parameters: ``dir=PATH`` (where it logs what it saw and keeps its "device lost" markers), ``lose=HANDLE``
(the first case run on that device marks the device lost and kills the worker: from then on a worker that
sees that device finds it unavailable, as a fallen-off-the-bus GPU is).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from backends.base import Availability
from backends.emulator import EmulatorBackend

VISIBLE = "CUDA_VISIBLE_DEVICES"


class FakeDeviceBackend(EmulatorBackend):
    name = "fake-device"
    covers = "a test double of a GPU library: the emulator's numbers on the device a worker was placed on"
    priority = -1000

    def __init__(self, **params):
        self.dir = Path(params.pop("dir"))
        self.lose = params.pop("lose", None)
        super().__init__(**params)

    def _seen(self) -> "str | None":
        return os.environ.get(VISIBLE)

    def availability(self) -> Availability:
        dev = self._seen()
        if dev is not None and (self.dir / f"lost-{dev}").exists():
            return Availability(False, f"device {dev} lost: no device answers", None, None)
        return Availability(True, "fake device library", "0", dev or "no device placement")

    def run(self, prepared, x, **inputs):
        dev = self._seen()
        c = prepared.case
        with open(self.dir / "seen.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"device": dev, "shape": [c.M, c.N, c.K], "pid": os.getpid()}) + "\n")
        if dev is not None and dev == self.lose:
            (self.dir / f"lost-{dev}").write_text("lost")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run(prepared, x, **inputs)
