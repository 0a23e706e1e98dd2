"""The model compiler: ONNX frontend, fusion and kernel planning, and the deploy runtime.

One layer with no server imports (import-linter contract in pyproject.toml): `tuner build`,
`tuner run` and the Python API use it without FastAPI or a database. `frontend` turns an ONNX
model into tasks and a layer plan; `deploy` compiles the plan into a library and runs it.
"""
