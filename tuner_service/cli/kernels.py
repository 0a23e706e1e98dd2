"""Kernel commands that need no server: ``space``, ``codegen``, ``measure``, ``tune``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from schedule_templates.errors import ScheduleError
from schedule_templates.records import MeasureOptions, MeasureResult
from schedule_templates.space import Config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("space", help="show a workload's knobs and space size")
    _workload_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_space)

    p = sub.add_parser("codegen", help="print the generated code of one config")
    _workload_args(p)
    _config_args(p)
    p.add_argument("--ir", action="store_true", help="print the loop-nest IR instead")
    p.set_defaults(func=cmd_codegen)

    p = sub.add_parser("measure", help="compile, check against numpy and time one config")
    _workload_args(p)
    _config_args(p)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser("tune", help="tune one workload locally, in this process")
    _workload_args(p)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--tuner", default="xgb")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--records", metavar="FILE",
                   help="xgb-transfer: measurement records (JSON lines from GET /api/v1/records, "
                        "--save-records or AutoTVM logs) of other workloads to start from")
    p.add_argument("--save-records", metavar="FILE",
                   help="append every measured config to FILE as JSON lines (for --records)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tune)


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="workload key, e.g. dense:M=1024,N=1024,K=1024")
    p.add_argument("--target", default="llvm")


def _config_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--config-index", type=int)
    group.add_argument("--config", help="config JSON ({'index': ...} or {'entity': [...]})")
    group.add_argument("--default", action="store_true",
                       help="the template's default config (used when no config is given)")


def _resolve(args: argparse.Namespace) -> tuple[Any, Any, Config]:
    from schedule_templates.templates.base import get_template
    from schedule_templates.workloads import parse_workload

    workload = parse_workload(args.workload)
    template = get_template(workload.op, args.target)
    space = template.space(workload)
    if getattr(args, "config_index", None) is not None:
        config = space.get(args.config_index)
    elif getattr(args, "config", None):
        try:
            data = json.loads(args.config)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: --config is not JSON: {e}") from None
        config = space.from_json(data)
    else:
        config = template.default_config(workload)
    return workload, template, config


def _fail(error: Exception) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 2


def cmd_space(args: argparse.Namespace) -> int:
    from schedule_templates.templates.base import get_template
    from schedule_templates.workloads import parse_workload

    try:
        workload = parse_workload(args.workload)
        template = get_template(workload.op, args.target)
    except ScheduleError as e:
        return _fail(e)
    space = template.space(workload)
    info = {"workload": workload.key, "target": args.target, "template": template.name,
            "template_version": template.version, "size": space.size, "knobs": space.describe()}
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{workload.describe()}  [{template.name} v{template.version}]")
    for knob in info["knobs"]:
        print(f"  {knob['name']:<14} {knob['kind']}  {knob['size']:>6} values")
    print(f"space size: {space.size:,}")
    return 0


def cmd_codegen(args: argparse.Namespace) -> int:
    from schedule_templates.codegen.llvm_ir import generate_llvm_ir
    from schedule_templates.ir.printer import format_kernel
    from schedule_templates.runtime import lower

    try:
        workload, template, config = _resolve(args)
        kernel = lower(workload, template, config)
    except ScheduleError as e:
        return _fail(e)
    if args.ir:
        print(format_kernel(kernel))
    elif template.target_kind == "cuda":
        from schedule_templates.codegen.cuda_c import generate_cuda

        try:
            print(generate_cuda(kernel).source, end="")
        except ScheduleError as e:
            return _fail(e)
    else:
        print(str(generate_llvm_ir(kernel)))
    return 0


def _measure_options() -> MeasureOptions:
    return MeasureOptions(number=1, repeat=3, min_repeat_ms=50.0)


def cmd_measure(args: argparse.Namespace) -> int:
    from workers.measure import measure_candidate

    try:
        workload, template, config = _resolve(args)
    except ScheduleError as e:
        return _fail(e)
    result = measure_candidate(workload.key, template.name, config.to_json(), args.target,
                               _measure_options(), args.threads)
    report = _result_json(workload.key, args.target, config, result, workload.flops())
    if args.json:
        print(json.dumps(report))
    elif result.ok:
        print(f"{workload.describe()}: {report['gflops']:.1f} GFLOPS, "
              f"{result.mean_cost * 1e3:.4f} ms (config {config.index})")
    else:
        print(f"{workload.describe()}: {result.error.name}: {result.error_message}")
    return 0 if result.ok else 1


def _result_json(key: str, target: str, config: Config, result: MeasureResult, flops: int
                 ) -> dict[str, Any]:
    return {
        "workload": key,
        "target": target,
        "config": config.to_json(),
        "gflops": result.gflops(flops) if result.ok else None,
        "latency_s": result.mean_cost if result.ok else None,
        "error": None if result.ok else {"kind": result.error.name.lower(),
                                          "message": result.error_message},
    }


def cmd_tune(args: argparse.Namespace) -> int:
    from schedule_templates.templates.base import get_template
    from schedule_templates.workloads import parse_workload
    from tuner_service.tuners import TRANSFER_TUNERS, make_tuner
    from tuner_service.tuners.transfer import parse_records, record_json
    from tuner_service.tuning.isolated import IsolatedMeasure
    from tuner_service.tuning.local_loop import best_trial, tune

    if args.records and args.tuner not in TRANSFER_TUNERS:
        return _fail(ValueError(f"--records is used by {', '.join(sorted(TRANSFER_TUNERS))}"))
    try:
        workload = parse_workload(args.workload)
        template = get_template(workload.op, args.target)
        transfer = []
        if args.records:
            with open(args.records) as lines:
                transfer = parse_records(lines, template.name, args.target, template.version)
        tuner = make_tuner(args.tuner, workload, template.space(workload), args.seed,
                           template=template, transfer=transfer)
        saved = open(args.save_records, "a") if args.save_records else None  # noqa: SIM115
    except (ScheduleError, ValueError, OSError) as e:
        return _fail(e)
    measure = IsolatedMeasure(workload.key, template.name, args.target, args.threads,
                              _measure_options())

    def on_trial(trial: Any) -> None:
        progress.update(trial)
        if saved is not None:
            saved.write(json.dumps(record_json(workload.key, template, args.target,
                                               trial.config, trial.result)) + "\n")
            saved.flush()

    with measure, _Progress(args.trials, quiet=args.json) as progress:
        try:
            history = tune(workload, tuner, args.trials, measure, args.batch, on_trial,
                           initial=[template.default_config(workload).index])
        finally:
            if saved is not None:
                saved.close()
    best = best_trial(history)
    report = {
        "workload": workload.key,
        "target": args.target,
        "trials": len(history),
        "best": None if best is None else {"config": best.config.to_json(),
                                           "gflops": best.gflops,
                                           "latency_s": best.result.mean_cost},
        "history": [{"trial": t.trial, "gflops": t.gflops,
                     "error": None if t.result.ok else t.result.error.name.lower()}
                    for t in history],
    }
    if args.json:
        print(json.dumps(report))
    elif best is not None:
        print(f"best: {best.gflops:.1f} GFLOPS, {best.result.mean_cost * 1e3:.4f} ms, "
              f"config {json.dumps(best.config.to_json())}")
    else:
        print("no config ran successfully")
    return 0 if best is not None else 1


class _Progress:
    """A progress line (rich when installed) with the best GFLOPS so far."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.best = total, quiet, 0.0
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if not self.quiet:
            try:
                from rich.progress import Progress
            except ImportError:
                return self
            self._bar = Progress(transient=False)
            self._bar.start()
            self._task = self._bar.add_task("tuning", total=self.total)
        return self

    def update(self, trial: Any) -> None:
        self.best = max(self.best, trial.gflops)
        if self._bar is not None:
            self._bar.update(self._task, advance=1,
                             description=f"best {self.best:7.1f} GFLOPS")
        elif not self.quiet:
            print(f"trial {trial.trial}/{self.total}: {trial.gflops:.1f} GFLOPS "
                  f"(best {self.best:.1f})", file=sys.stderr)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
