"""Generated operators: a model's non-tunable work as kernels of our IR (see ``base``)."""
