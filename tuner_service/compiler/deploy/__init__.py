"""Deployable kernel libraries: ``tuner build`` compiles a model's tuned layers into one shared
library with a C ABI and a manifest (``library``), ``tuner run`` loads it (``loader``) and runs
the model (``executor``): kernels for the planned layers, numpy for every other operator
(``ops_tensor``, ``ops_nn``). See docs/deploy.md for the ABI and the manifest."""
