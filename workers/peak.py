"""The device's measured fp32 peak, per thread count, for results' ``peak_gflops``.

The backend measures it with its own code (an FMA loop for ``llvm``), once per thread count,
in the agent process and only between batches, so it never competes with a timed kernel.
"""

from __future__ import annotations

import logging

from workers.backends import Backend, BackendSpec, create_backend

logger = logging.getLogger(__name__)


class PeakGauge:
    def __init__(self, spec: BackendSpec) -> None:
        self._spec = spec
        self._backend: Backend | None = None
        self._peaks: dict[int, float | None] = {}

    def peak(self, threads: int) -> float | None:
        """GFLOPS on ``threads`` threads, measured on first use; None when unknown."""
        if threads not in self._peaks:
            self._peaks[threads] = self._measure(threads)
        return self._peaks[threads]

    def known(self) -> dict[str, float]:
        return {str(t): round(p, 1) for t, p in sorted(self._peaks.items()) if p is not None}

    def _measure(self, threads: int) -> float | None:
        try:
            if self._backend is None:
                self._backend = create_backend(self._spec)
            peak = self._backend.measure_peak(threads)
        except Exception as e:  # a peak is a nicety: never let it stop the worker
            logger.warning("could not measure the peak on %d threads: %s", threads, e)
            return None
        if peak is not None:
            logger.info("measured peak on %d threads: %.1f GFLOPS", threads, peak)
        return peak

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
