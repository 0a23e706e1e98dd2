"""``/docs`` (Swagger UI) and ``/redoc`` served from files installed with the package, so the
API pages work offline like the dashboard (FastAPI's defaults load them from a CDN).

The JavaScript and CSS come from the ``fastapi-offline`` wheel (pinned in pyproject), which
ships Swagger UI and ReDoc builds; only its static folder is used.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

logger = logging.getLogger(__name__)

ASSETS_URL = "/docs-assets"
_PACKAGE = "fastapi_offline"


def assets_dir() -> Path | None:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "static"
    return folder if (folder / "swagger-ui-bundle.js").is_file() else None


def install_docs(app: FastAPI) -> None:
    """Mount the assets and the two pages; without the assets keep FastAPI's CDN pages."""
    folder = assets_dir()
    if folder is None:
        logger.warning("%s is not installed: /docs and /redoc load their scripts from a CDN",
                       _PACKAGE)
        app.docs_url, app.redoc_url = "/docs", "/redoc"
        app.setup()
        return
    app.mount(ASSETS_URL, StaticFiles(directory=folder), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url, title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png", with_google_fonts=False)
