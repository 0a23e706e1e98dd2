"""The learned cost model: scores loop-nest feature rows so the search measures fewer configs."""

from tuner_service.cost_model.base import CostModel, CostModelError, TrainingSet, stack
from tuner_service.cost_model.metrics import (
    normalise,
    pairwise_accuracy,
    throughputs,
    top_k_recall,
)
from tuner_service.cost_model.transfer import (
    Prior,
    PriorCache,
    TransferCostModel,
    TransferParams,
)
from tuner_service.cost_model.xgb import DEFAULT_OBJECTIVE, OBJECTIVES, XGBCostModel, XGBParams

__all__ = [
    "DEFAULT_OBJECTIVE", "OBJECTIVES", "CostModel", "CostModelError", "Prior", "PriorCache",
    "TrainingSet",
    "TransferCostModel", "TransferParams", "XGBCostModel", "XGBParams", "normalise",
    "pairwise_accuracy", "stack", "throughputs", "top_k_recall",
]
