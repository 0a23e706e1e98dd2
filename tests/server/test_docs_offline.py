"""``/docs`` and ``/redoc`` load their scripts from the server itself, never from a CDN."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient


def test_api_pages_work_offline(client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        answer = client.get(page)
        assert answer.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]+)"', answer.text)
        assert urls, answer.text
        assert all(url.startswith("/") for url in urls), urls  # nothing from another host
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 100, url
    assert client.get("/openapi.json").json()["info"]["title"] == "tuner service"
