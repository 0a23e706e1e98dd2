"""Measuring candidates: the run protocol, the in-process runner and process isolation."""

from workers.measure.pool import IsolatedMeasurer
from workers.measure.runner import Phase, compare_output, measure_candidate, measure_task
from workers.measure.timing import time_protocol

__all__ = [
    "IsolatedMeasurer",
    "Phase",
    "compare_output",
    "measure_candidate",
    "measure_task",
    "time_protocol",
]
