"""Test doubles of the suite: backends with planted bugs (mutants) and injected faults (faulty).

They are not kernels and are never registered as built-ins: the self-test (conformance/selftest/mutation.py)
and the runner's tests load them by module path (``QCONFORM_EXTRA_BACKENDS``).
"""
