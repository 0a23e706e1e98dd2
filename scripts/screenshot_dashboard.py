"""Screenshots of the dashboard during a real tuning run, for the README.

Runs ``tuner up`` (SQLite server, one local LLVM worker measuring real generated kernels) on a
sample model with a small budget, waits until the job has used the wanted share of its budget,
then opens the job and workers pages in headless Chromium (Debian's, driven by Playwright) at
1280x800 and saves PNGs.

    python scripts/screenshot_dashboard.py                      # resnet18, 16 trials per task
    python scripts/screenshot_dashboard.py --trials-per-task 32 --at 0.6 --out /tmp/shots
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def default_tuner() -> str:
    from tuner_service.tuners import tuner_names

    names = tuner_names()
    return "xgb" if "xgb" in names else "random"


@contextlib.contextmanager
def tuner_up(args: argparse.Namespace, data_dir: Path) -> Iterator[tuple[str, int]]:
    """``tuner up --no-wait`` in a child process; yields (server URL, job id)."""
    command = [sys.executable, "-m", "tuner_service.cli.main", "up", "--data-dir", str(data_dir),
               "--model", args.model, "--trials-per-task", str(args.trials_per_task),
               "--tuner", args.tuner, "--threads", str(args.threads), "--port", str(args.port),
               "--no-wait"]
    log_path = data_dir / "up.log"
    with log_path.open("w") as log:  # a file, not a pipe: a full pipe would stall the server
        # HOME in the scratch dir: the local worker's spool (~/.tuner/spool) must not collide
        # with another worker already running on this machine
        env = {**os.environ, "HOME": str(data_dir)}
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   text=True, env=env)
    try:
        url, job_id = None, None
        deadline = time.monotonic() + 300
        while url is None and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            text = log_path.read_text()
            if match := re.search(r"job (\d+):", text):
                job_id = int(match.group(1))
            if match := re.search(r"dashboard: (http://\S+?)/?\s", text):
                url = match.group(1)
        print("\n".join(f"  tuner up | {line}" for line in log_path.read_text().splitlines()))
        if url is None or job_id is None:
            raise SystemExit(f"`tuner up` did not start serving (exit code {process.poll()})")
        yield url, job_id
    finally:
        stop(process)


def stop(process: subprocess.Popen[str]) -> None:
    """Ctrl-C first (``tuner up`` then stops its worker and server cleanly), then harder."""
    process.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
        return
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)
        return
    process.kill()
    process.wait()


def wait_for_progress(url: str, job_id: int, share: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=30) as http:
        while True:
            status = http.get(f"/api/v1/jobs/{job_id}").json()
            done = sum(t["trials_done"] for t in status["tasks"])
            budget = sum(t["trials_budget"] for t in status["tasks"]) or 1
            print(f"job {job_id}: {status['status']}, {done}/{budget} trials", flush=True)
            if status["status"] in ("done", "failed", "cancelled") or done >= share * budget:
                return
            if time.monotonic() > deadline:
                print("timed out waiting; taking the screenshots now", file=sys.stderr)
                return
            time.sleep(10)


def screenshot(url: str, job_id: int, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    # (page, element to wait for, element to capture or None for the window, file)
    shots = [(f"/jobs/{job_id}", "#task-charts svg[data-points]", None, "dashboard.png"),
             (f"/jobs/{job_id}", "#task-rows tr", "#tasks-panel", "dashboard-tasks.png"),
             ("/workers", "main tbody tr", None, "dashboard-workers.png")]
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        for path, ready, element, name in shots:
            page.goto(url + path)
            page.wait_for_selector(ready)
            page.wait_for_timeout(1500)  # one more poll, and the fonts settled
            target = out / name
            if element:  # unstick the top bar, or it covers the element once scrolled
                page.add_style_tag(content=".topbar { position: static; }")
                page.locator(element).screenshot(path=str(target))
            else:
                page.screenshot(path=str(target))
            written.append(target)
            print(f"wrote {target}")
        browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials-per-task", type=int, default=16)
    parser.add_argument("--tuner", default=None, help="default: xgb when installed, else random")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--at", type=float, default=1.0,
                        help="screenshot once this share of the budget is measured")
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    args.tuner = args.tuner or default_tuner()
    # A shell starts background jobs with Ctrl-C ignored, and children inherit that; a Python
    # handler here is reset to the default in the child, so `tuner up` can be stopped cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="tuner-shot-") as tmp, \
            tuner_up(args, Path(tmp)) as (url, job_id):
        wait_for_progress(url, job_id, args.at, args.timeout_s)
        screenshot(url, job_id, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
