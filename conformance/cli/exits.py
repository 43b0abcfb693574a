"""The exit statuses every ``qconform`` command shares (docs/conformance.md#exit-status)."""

#: 0 success / conformant; 1 a failing verdict; 2 bad input or usage (one line names it); 3 an internal error
EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3

__all__ = ["EXIT_OK", "EXIT_FAIL", "EXIT_INPUT", "EXIT_INTERNAL"]
