"""Measuring candidates: the in-process runner and process isolation (the run protocol each
backend times itself with is ``workers.backends.timing``)."""

from workers.backends.timing import time_protocol
from workers.measure.pool import IsolatedMeasurer
from workers.measure.runner import Phase, compare_output, measure_candidate, measure_task

__all__ = [
    "IsolatedMeasurer",
    "Phase",
    "compare_output",
    "measure_candidate",
    "measure_task",
    "time_protocol",
]
