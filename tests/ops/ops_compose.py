"""Reading docker-compose.yml the way ``docker compose`` does, for tests on a machine without
Docker: variable interpolation, the commands a service runs, and its environment."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"

# $$ (a literal $), ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}
_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                       r"(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")


class MissingVariable(KeyError):
    """A required variable (``${NAME:?message}``) is unset or empty."""


def load_compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def variables(text: str) -> dict[str, str | None]:
    """Every variable the text names, with its operator (``:?``, ``:-``, ... or None); a
    variable required anywhere (``?``) reads as required."""
    found: dict[str, str | None] = {}
    for match in _VARIABLE.finditer(text):
        name = match.group("name") or match.group("bare")
        if name and "?" not in (found.get(name) or ""):
            found[name] = match.group("op")
    return found


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's interpolation, applied to every string in ``value``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        current = env.get(name)
        empty = current is None or (current == "" and op is not None and op.startswith(":"))
        if op in (":?", "?") and empty:
            raise MissingVariable(f"{name}: {arg}")
        if op in (":-", "-") and empty:
            return arg
        return current or ""

    return _VARIABLE.sub(replace, value)


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment as a dict (compose accepts a mapping or NAME=value lines)."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def commands(service: Mapping[str, Any]) -> list[list[str]]:
    """The command lines a service runs: its ``command``, with ``sh -c "a && exec b"`` split
    (``exec`` only makes the last one replace the shell, so it receives the stop signal)."""
    command = service["command"]
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    if words[:2] == ["sh", "-c"] and len(words) == 3:
        parts = [shlex.split(part) for part in words[2].split("&&")]
        return [part[1:] if part[:1] == ["exec"] else part for part in parts]
    return [words]
