"""``tuner log``: pre-tuned packs of the shared tuning log, per device class (TVM's TopHub).

``tuner log export --device-class CLASS -o pack.json`` saves the best configs of one device
class (``--resolve``: for every workload, what a lookup for that class finds, falling back to
the same microarchitecture or ISA level); ``tuner log import pack.json`` stores a pack on a
server; ``tuner log device-class`` prints this machine's class. ``tuner build --configs
pack.json`` builds with a pack as is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schedule_templates.protocol import Target

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = subparsers.add_parser(
        "log", help="export and import pre-tuned packs of the shared tuning log",
        description=__doc__.splitlines()[0] if __doc__ else None)
    sub = group.add_subparsers(dest="log_command", required=True, metavar="ACTION")

    export = sub.add_parser("export", help="save the best configs of one device class")
    export.add_argument("--device-class", default=None,
                        help="kind:vendor:microarch:isa_level:model:cores "
                        "(default: this machine's, see `tuner log device-class`)")
    export.add_argument("--target", default=None, help="only this target (needed by --resolve)")
    export.add_argument("--threads", type=int, default=None, help="only this thread count")
    export.add_argument("--resolve", action="store_true",
                        help="for every workload, the entry a lookup for the class finds")
    export.add_argument("-o", "--output", type=Path, required=True, metavar="PACK.json")
    _connection_flags(export)
    export.set_defaults(func=run_export)

    load = sub.add_parser("import", help="store a pack in the server's shared tuning log")
    load.add_argument("pack", type=Path, metavar="PACK.json")
    _connection_flags(load)
    load.set_defaults(func=run_import)

    show = sub.add_parser("device-class", help="print this machine's device class")
    show.add_argument("--json", action="store_true", help="every field, as JSON")
    show.set_defaults(func=run_device_class)


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="server URL (default: TUNER_SERVER_URL or saved)")
    parser.add_argument("--token", help="bearer token (default: TUNER_TOKEN or saved)")


def local_device_class(target: str = "llvm") -> str:
    """This machine's class for ``target`` (the GPU's for a CUDA target when one is readable)."""
    from workers.backends import accelerator_facts
    from workers.hardware import device_class

    facts: dict[str, Any] = {}
    if Target.parse(target).kind == "cuda":
        try:
            facts = accelerator_facts("cuda")
        except ImportError:  # no pycuda here: the CPU's class (lookups fall back from it)
            facts = {}
    return device_class(facts).id


def run_device_class(args: argparse.Namespace) -> int:
    from workers.device_class import DeviceClass

    found = DeviceClass.parse(local_device_class())
    print(json.dumps(found.to_json(), indent=2) if args.json else found.id)
    return 0


def run_export(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        return _bad_input("--threads must be at least 1")
    if args.resolve and not args.target:
        return _bad_input("--resolve needs --target")
    params: dict[str, Any] = {"device_class": args.device_class or local_device_class(
        args.target or "llvm"), "resolve": args.resolve}
    params.update({k: v for k, v in (("target", args.target), ("threads", args.threads)) if v})
    pack = _call(args, "GET", "/packs", params=params)
    if pack is None:
        return EXIT_FAILED
    try:
        args.output.write_text(json.dumps(pack, indent=1) + "\n")
    except OSError as e:
        return _bad_input(f"cannot write {args.output}: {e.strerror or e}")
    print(f"wrote {args.output}: {len(pack['tasks'])} configs of {pack['device_class']}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    try:
        text = args.pack.read_text()
    except OSError as e:
        return _bad_input(f"cannot read {args.pack}: {e.strerror or e}")
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return _bad_input(f"{args.pack} is not JSON: {e}")
    answer = _call(args, "POST", "/packs", content=text.encode(),
                   headers={"Content-Type": "application/json"})
    if answer is None:
        return EXIT_FAILED
    print(f"imported {answer['imported']} configs of "
          f"{', '.join(answer['device_classes']) or 'no device class'}")
    return 0


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """The server's answer, or None after printing why there is none."""
    from tuner_service.cli.client import ClientError, ServiceClient, resolve_server

    try:
        with ServiceClient(*resolve_server(args)) as client:
            return client.request(method, path, **kwargs)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def _bad_input(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT
