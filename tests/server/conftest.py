"""Server fixtures: the toy template (settings, apps and tokens come from tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from .fakes import toy_template_class


@pytest.fixture
def toy_template(monkeypatch: pytest.MonkeyPatch) -> Any:
    from schedule_templates.templates import base

    base.all_templates()  # load the built-in ones first
    cls = toy_template_class()
    monkeypatch.setitem(base._TEMPLATES, cls.name, cls())
    return base._TEMPLATES[cls.name]
