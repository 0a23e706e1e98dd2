"""The tuning server: REST API, database, ONNX frontend, tuners, cost model, scheduler, CLI."""
