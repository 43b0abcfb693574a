"""Test doubles for the run command's honesty checks (registered through QCONFORM_EXTRA_BACKENDS).

- ``absent``: a backend that is never available (its device is missing);
- ``declines``: available, but ``can_implement`` says no to every case.

Both are the emulator otherwise; neither is a kernel.
"""

from backends.base import Availability, no
from backends.emulator import EmulatorBackend


class Absent(EmulatorBackend):
    name = "absent"
    covers = "test double: never available"

    def availability(self):
        return Availability(False, "test double: its device is not installed", None, None)


class Declines(EmulatorBackend):
    name = "declines"
    covers = "test double: implements nothing"

    def can_implement(self, case):
        return no(f"test double declines {case.scheme}")


SPEC = "absent=run_doubles:Absent,declines=run_doubles:Declines"
