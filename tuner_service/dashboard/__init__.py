"""The dashboard: a small single-page app served at ``/`` with its own JSON reads.

Pages: jobs (``/``), a job (``/jobs/{id}``), workers (``/workers``) and the shared tuning log
(``/tuning-log``). Every asset is served from this package (no CDN); charts are SVG drawn by
``static/js/charts.js``. Pages poll the ``/api/v1/dashboard`` reads, incrementally.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

STATIC_PATH = "/dashboard/static"


def mount(app: FastAPI) -> None:
    from tuner_service.dashboard.routes import api, pages

    app.include_router(api, prefix="/api/v1")
    app.include_router(pages)
    app.mount(STATIC_PATH, StaticFiles(packages=[("tuner_service.dashboard", "static")]),
              name="dashboard-static")
