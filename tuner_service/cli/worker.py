"""``tuner worker``: attach this machine to a tuning server as a measurement worker.

Imports only the ``workers`` package (inside the handler), so it runs on a worker-only install.
The environment is read here and nowhere else in the worker: ``TUNER_SERVER``, ``TUNER_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from schedule_templates.protocol import MessageError, Target
from tuner_service.cli.errors import UsageError

ENV_SERVER = "TUNER_SERVER"
ENV_TOKEN = "TUNER_TOKEN"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker", help="measure candidates for a tuning server",
        description="Pull candidates from a tuning server, build and time them in isolated "
                    "child processes, and report the results.")
    parser.add_argument("--server", default=os.environ.get(ENV_SERVER),
                        help=f"server URL (env {ENV_SERVER})")
    parser.add_argument("--token", default=os.environ.get(ENV_TOKEN),
                        help=f"worker token (env {ENV_TOKEN})")
    parser.add_argument("--device-key", required=True,
                        help="the device class this worker measures for (jobs name it)")
    parser.add_argument("--target", default="llvm", help="target string (default: llvm)")
    parser.add_argument("--name", default=None, help="a name for dashboards (default: host)")
    parser.add_argument("--backend", default=None,
                        help="measurement backend: llvm or fake (default: the target's kind)")
    parser.add_argument("--backend-option", action="append", default=[], metavar="KEY=JSON",
                        help="a backend constructor option, e.g. run_s=0.5 (repeatable)")
    parser.add_argument("--fake-failures", default="", metavar="MODE=RATE,...",
                        help="fake backend: failure rates, e.g. wrong=0.05,segfault=0.01")
    parser.add_argument("--parallel-build", type=int, default=1, metavar="P",
                        help="candidates compiled at once; timed runs never overlap")
    parser.add_argument("--max-items", type=int, default=0, metavar="N",
                        help="items per claim (default: one per build slot)")
    parser.add_argument("--threads", type=int, default=0, metavar="T",
                        help="most threads a kernel may use (default: all usable cores)")
    parser.add_argument("--spool-dir", type=Path, default=None,
                        help="where unacknowledged results wait (default: ~/.tuner/spool)")
    parser.add_argument("--max-idle-s", type=float, default=None, metavar="S",
                        help="exit after S seconds without work")
    parser.add_argument("--poll-s", type=float, default=5.0, help="long-poll wait per claim")
    parser.add_argument("--once", action="store_true",
                        help="exit after one batch has been measured and reported")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workers.agent import run_worker
    from workers.backends.fake import parse_rates
    from workers.settings import WorkerSettings, default_spool_dir

    if not args.server or not args.token:
        print(f"error: tuner worker needs --server and --token (or {ENV_SERVER}, {ENV_TOKEN})",
              file=sys.stderr)
        return 2
    try:
        target = Target.parse(args.target)
    except MessageError as e:
        print(f"error: tuner worker: {e}", file=sys.stderr)
        return 2
    backend = args.backend or target.kind
    if backend == "cuda" and target.option("-arch") is None:
        args.target = str(_cuda_target(target))  # records keep the architecture it measured
    try:
        options = parse_backend_options(args.backend_option)
        if args.fake_failures:
            options["rates"] = parse_rates(args.fake_failures)
        extra = {"name": args.name} if args.name else {}
        settings = WorkerSettings(
            server=args.server, token=args.token, device_key=args.device_key,
            target=args.target, backend=backend, backend_options=options,
            parallel_build=args.parallel_build, max_items=args.max_items, threads=args.threads,
            spool_dir=args.spool_dir or default_spool_dir(), max_idle_s=args.max_idle_s,
            once=args.once, poll_s=args.poll_s, **extra)
    except ValueError as e:
        print(f"error: tuner worker: {e}", file=sys.stderr)
        return 2
    return run_worker(settings)


def _cuda_target(target: Target) -> Target:
    from workers.backends.cuda import gpu_facts, target_for
    from workers.errors import WorkerError

    try:
        return target_for(gpu_facts(), target)
    except WorkerError as e:
        raise UsageError(f"tuner worker: {e}") from None


def parse_backend_options(pairs: list[str]) -> dict[str, Any]:
    """``["run_s=0.5", "validate=false"]`` -> ``{"run_s": 0.5, "validate": False}``."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--backend-option expects KEY=VALUE, got {pair!r}")
        try:
            options[key.strip()] = json.loads(text)
        except ValueError:
            options[key.strip()] = text  # a bare string
    return options
