"""Tuning loops: the part that asks a tuner, measures, and tells it (never the strategy)."""
