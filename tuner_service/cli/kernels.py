"""Kernel commands that need no server: ``space``, ``codegen``, ``measure``, and the one-workload
form of ``tune`` (``cli/tune.py`` parses it)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from schedule_templates.errors import InvalidConfigError, ScheduleError
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
        if not space.is_valid(config.index):
            share = valid_share(space)
            raise InvalidConfigError(
                f"config {config.index} is filtered out by {template.name} (it keeps about "
                f"{share:.0%} of the indices; `tuner space {workload.key}` says more); try "
                f"--config-index {first_valid(space, config.index)} or --default")
    elif getattr(args, "config", None):
        try:
            data = json.loads(args.config)
        except json.JSONDecodeError as e:
            raise InvalidConfigError(f"--config is not JSON: {e}") from None
        config = space.from_json(data)
    else:
        config = template.default_config(workload)
    return workload, template, config


def valid_share(space: Any, samples: int = 2000) -> float:
    """The share of indices the template's constraint keeps: exact for small spaces, else
    estimated from a fixed random sample (the same answer every run)."""
    import numpy as np

    if space.size <= samples:
        indices = list(range(space.size))
    else:
        rng = np.random.default_rng(0)
        indices = [space.random_index(rng) for _ in range(samples)]
    return sum(space.is_valid(i) for i in indices) / len(indices)


def first_valid(space: Any, start: int) -> int:
    """The nearest index at or after ``start`` (wrapping) that the template keeps."""
    for offset in range(space.size):
        index = (start + offset) % space.size
        if space.is_valid(index):
            return index
    return start


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
    share = valid_share(space)
    info = {"workload": workload.key, "target": args.target, "template": template.name,
            "template_version": template.version, "size": space.size, "valid_share": share,
            "knobs": space.describe()}
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{workload.describe()}  [{template.name} v{template.version}]")
    for knob in info["knobs"]:
        print(f"  {knob['name']:<14} {knob['kind']}  {knob['size']:>6} values")
    estimated = "" if space.size <= 2000 else "about "
    print(f"space size: {space.size:,} indices, of which the template keeps {estimated}"
          f"{share:.0%}\n(it filters out the rest; `tuner codegen` refuses those indices)")
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


def tune_workload(args: argparse.Namespace) -> int:
    """``tuner tune KEY``: tune one workload in this process (``args`` from ``cli/tune.py``)."""
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
    if args.json:
        print(json.dumps(_tune_report(workload.key, args.target, history, best)))
    elif best is not None:
        print(f"best: {best.gflops:.1f} GFLOPS, {best.result.mean_cost * 1e3:.4f} ms, "
              f"config {json.dumps(best.config.to_json())}")
    else:
        print("no config ran successfully")
    return 0 if best is not None else 1


def _tune_report(key: str, target: str, history: list[Any], best: Any) -> dict[str, Any]:
    return {
        "workload": key,
        "target": target,
        "trials": len(history),
        "best": None if best is None else {"config": best.config.to_json(),
                                           "gflops": best.gflops,
                                           "latency_s": best.result.mean_cost},
        "history": [{"trial": t.trial, "gflops": t.gflops,
                     "error": None if t.result.ok else t.result.error.name.lower()}
                    for t in history],
    }


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
