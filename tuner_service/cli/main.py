"""The ``tuner`` console script.

Each command group lives in its own module with a ``register(subparsers)`` function. Modules are
imported here, but they import heavy dependencies (fastapi, sqlalchemy, xgboost) only inside
their handlers, so ``tuner worker`` runs on a worker-only install.
"""

from __future__ import annotations

import os

# OpenBLAS threads that spin after a numpy call steal the cores our kernels are timed on;
# numpy here only computes reference results, so one BLAS thread is enough. Must precede numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import importlib
import logging
import sys
from typing import NoReturn

from tuner_service import logging_setup
from tuner_service.cli.errors import EXIT_BAD_INPUT, user_error

# Command-group modules, in help order.
_GROUPS = (
    "tuner_service.cli.kernels",  # space, codegen, measure
    "tuner_service.cli.tune",  # tune (a model or one workload)
    "tuner_service.cli.models",  # extract, sample-model
    "tuner_service.cli.server",  # serve, db, token, up
    "tuner_service.cli.client",  # submit, status, fetch
    "tuner_service.cli.worker",  # worker
    "tuner_service.cli.refresh",  # refresh
    "tuner_service.cli.deploy",  # build, run
    "tuner_service.cli.log",  # log export, log import, log device-class
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (the full usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="text or JSON lines (default: TUNER_LOG_FORMAT, else text)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _GROUPS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # a group not built yet
                continue
            raise
        module.register(sub)
    return parser


#: long-running services log at INFO by default; one-shot commands only warn (``-v``: debug)
_SERVICES = ("serve", "worker", "refresh")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.log_format = logging_setup.resolve_format(args.log_format)
    except ValueError as e:
        parser.error(str(e))
    level = logging.INFO if args.command in _SERVICES else logging.WARNING
    logging_setup.configure(args.log_format, logging.DEBUG if args.verbose else level)
    if not args.verbose:
        logging_setup.quiet_libraries()
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_stdout()
    except Exception as e:
        message = user_error(e)
        if message is None:
            raise  # a bug: the traceback is the report
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return int(code or 0)


def _closed_stdout() -> int:
    """The reader went away (``tuner codegen ... | head -1``): stop quietly, as cat does, and
    keep Python from failing again when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a killed writer


if __name__ == "__main__":
    sys.exit(main())
