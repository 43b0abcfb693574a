"""The ``qconform`` command line: the parser, the one table of commands (``COMMANDS``), the error contract.

Each command lives with the room that owns it and is wired the same way: its module's
``register(subparsers, services)`` (the table below lists them; ``qconform --help`` lists the commands).
Errors in the input print one line naming the layer, tensor and problem and exit with status 2; no
traceback unless ``--debug`` (conformance/cli/exits.py has the statuses).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys

from conformance.cli.exits import EXIT_INPUT, EXIT_INTERNAL


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's contract for usage errors: one line naming the problem, exit 2
    (the full usage stays behind --help)."""

    def error(self, message: str):
        self.exit(EXIT_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


#: Every command, in the order ``qconform --help`` lists them: the module that owns it. Each defines
#: ``register(subparsers, services)``, the one way a command is wired (a test checks that nothing else adds a
#: sub-parser); packages built on the suite add theirs through the entry-point group ``qconform.commands``
#: with the same signature (benchmarks/: ``qconform bench``).
COMMANDS = (
    "conformance.cli.checkpoint_cmds",   # inspect, dequant, linear
    "conformance.cli.quantize_cmd",      # quantize
    "conformance.selftest.selfcheck",    # selfcheck
    "conformance.report.coverage",       # coverage
    "conformance.campaign.execute",      # campaign
    "conformance.cli.commands",          # run, replay, golden, target, backends
    "conformance.selftest.mutation",     # selftest
    "conformance.report.write",          # report
    "conformance.certify.cli",           # certify, verify-bundle
    "conformance.fingerprint.decide",    # fingerprint
    "qconform_torch.cli",                # model (docs/fallback.md)
)


@dataclasses.dataclass(frozen=True)
class Services:
    """What a command's room cannot import itself, handed to every ``register``: the report room sits below
    certify (``report merge`` verifies bundles with certify's verifier), and qconform_torch never imports the
    suite (``qconform model --certified`` asks the suite's certifier)."""

    verify_bundle: object
    certifier_factory: object


def _verify_bundle(folder):
    from conformance.certify import verify_bundle

    return verify_bundle(folder)


def _certifier(bundles):
    """`qconform model --certified B`: the suite's certifier of qconform_torch's op (docs/fallback.md)."""
    from conformance.certify.dispatch import CertificationStore

    return CertificationStore(bundles)


SERVICES = Services(verify_bundle=_verify_bundle, certifier_factory=_certifier)


def _command_entry_points():
    from importlib import metadata

    return sorted(metadata.entry_points(group="qconform.commands"), key=lambda ep: ep.name)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="qconform", description="Conformance suite and bit-exact emulator for quantized LLM formats")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(sub, SERVICES)
    # commands of packages built on the suite: the suite never imports them
    for ep in _command_entry_points():
        ep.load()(sub, SERVICES)
    return p


def _one_line(e: BaseException) -> str:
    """The error as one line (the contract: one line naming the layer, tensor and problem)."""
    text = str(e) if str(e) else type(e).__name__
    text = " ".join(text.split())
    return text if len(text) <= 2000 else text[:1997] + "..."  # a hostile value must not flood the terminal


def _closed_pipe() -> int:
    """The reader of our output went away (`qconform backends --json | head`): end quietly, as a
    command killed by SIGPIPE would (exit 141), without a traceback at interpreter shutdown."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + 13


def _output_named(args) -> str:
    """What a command writes, for an error that names no file: its --out / -o, else its first path."""
    for name in ("out", "output"):
        if getattr(args, name, None):
            return str(getattr(args, name))
    paths = getattr(args, "paths", None)
    return f"{paths[0]} (the folder written)" if paths else "an output file"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.cli_main = main  # commands that exercise the CLI itself (campaign) get it here, not by importing it
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # (`run` prints its --resume command)
    from emulator.errors import QconformError

    try:
        rc = int(args.fn(args) or 0)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except (QconformError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        if args.debug:
            raise
        print(f"qconform {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt as e:
        return 128 + int(getattr(e, "signum", 2))  # 130 Ctrl-C; a stopped run (RunInterrupted): 143 SIGTERM
    except Exception as e:  # an emulator bug, not the user's input: still no raw traceback
        if args.debug:
            raise
        from conformance.run.resultfile import is_output_error, unwritable

        if is_output_error(e):  # a full, read-only or over-quota output: the user's to fix, one line, exit 2
            where = _output_named(args)  # (a failed write() carries no file name: name what the command writes)
            print(f"qconform {args.command}: error: {_one_line(unwritable(e, where, verb=''))}", file=sys.stderr)
            return EXIT_INPUT
        print(f"qconform {args.command}: internal error ({type(e).__name__}: {_one_line(e)}); rerun with --debug and "
              "report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
