"""A test double declaring ``arithmetic=opaque`` (registered through QCONFORM_EXTRA_BACKENDS).

``noisy-opaque:snr_db=S`` returns the emulator's exact-path output plus deterministic noise scaled to
an SQNR of about S dB against it (NaN and infinite outputs kept as they are), and declares opaque
arithmetic with ``sqnr_floor_db = 40``. It is not a kernel: it stands for one whose arithmetic cannot
be declared exactly.
"""

import dataclasses

import numpy as np

from backends.emulator import EmulatorBackend
from emulator.numerics.floats import round_to_dtype

FLOOR_DB = 40.0


class NoisyOpaque(EmulatorBackend):
    name = "noisy-opaque"
    covers = "test double: opaque arithmetic with a chosen SQNR"
    priority = 80  # above every CPU kernel: the dispatcher would pick it if it did not refuse opaque ones

    def __init__(self, **params):
        self.snr_db = float(params.pop("snr_db", "60"))
        super().__init__(path="exact")

    def declared(self, case):
        return dataclasses.replace(super().declared(case), arithmetic="opaque", sqnr_floor_db=FLOOR_DB,
                                   accumulate="float32", notes="test double: opaque arithmetic")

    def run(self, prepared, x, **inputs):
        y = np.asarray(super().run(prepared, x, **inputs), np.float64)
        fin = np.isfinite(y)
        rms = float(np.sqrt(np.mean(y[fin] ** 2))) if fin.any() else 0.0
        noise = np.random.default_rng(0).standard_normal(y.shape) * rms * 10 ** (-self.snr_db / 20)
        out = np.where(fin, y + noise, y)
        return round_to_dtype(out, prepared.case.output_dtype).astype(np.float32)


SPEC = "noisy-opaque=opaque_doubles:NoisyOpaque"
