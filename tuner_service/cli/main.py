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

from tuner_service import logging_setup

# Command-group modules, in help order.
_GROUPS = (
    "tuner_service.cli.kernels",  # space, codegen, measure, tune
    "tuner_service.cli.models",  # extract, sample-model
    "tuner_service.cli.server",  # serve, db, token, up
    "tuner_service.cli.client",  # submit, status, fetch
    "tuner_service.cli.worker",  # worker
    "tuner_service.cli.refresh",  # refresh
    "tuner_service.cli.deploy",  # build, run
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__.splitlines()[0])
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.log_format = logging_setup.resolve_format(args.log_format)
    except ValueError as e:
        parser.error(str(e))
    logging_setup.configure(args.log_format, logging.DEBUG if args.verbose else logging.INFO)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
