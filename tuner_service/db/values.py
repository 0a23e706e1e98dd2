"""Checks every request value passes before a route sees it, in one place.

``check_tree`` walks a decoded JSON value without recursion (so a hostile nesting depth cannot
overflow the stack) and refuses what the databases or our own JSON output cannot hold: numbers
that are not finite (``NaN``, ``Infinity``, ``1e400``), integers beyond 64 bits, strings with
NUL or lone UTF-16 surrogates, and nesting deeper than a bound. ``bounded_json`` adds a size
bound for free-form objects (worker hardware facts...). ``safe_json`` turns anything (an error
that carries NaN, bytes, exceptions) into plain JSON, so an error answer can always be sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

#: the widest integer either database stores (BIGINT / SQLite INTEGER)
MAX_INT64 = 2**63 - 1
#: nesting bound for any request body
MAX_DEPTH = 32


def check_tree(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise ValueError naming the first offending place (``hardware.caches[2]``)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise ValueError(f"{where or 'value'}: nested deeper than {max_depth} levels")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str):
                    check_text(key, where, is_key=True)
                    place = f"{where}.{key}" if where else key
                else:
                    place = f"{where}[{key}]"
                stack.append((child, place[:200], depth + 1))
        elif isinstance(item, str):
            check_text(item, where)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -MAX_INT64 <= item <= MAX_INT64:
                raise ValueError(f"{where or 'value'}: integer out of the 64-bit range")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where or 'value'}: numbers must be finite (no NaN, Infinity "
                             "or values beyond about 1.8e308)")


def check_text(text: str, where: str, is_key: bool = False) -> None:
    what = "key" if is_key else "text"
    if "\x00" in text:
        raise ValueError(f"{where or 'value'}: {what} must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where or 'value'}: {what} is not valid Unicode (a lone surrogate "
                         f"at position {e.start})") from e


def bounded_json(max_bytes: int, max_depth: int) -> Callable[[Any], Any]:
    """A validator for a free-form JSON field: at most ``max_depth`` deep and ``max_bytes``
    long once encoded."""
    def check(value: Any) -> Any:
        check_tree(value, max_depth)
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False))
        if size > max_bytes:
            raise ValueError(f"at most {max_bytes} bytes of JSON (got {size})")
        return value

    return check


def safe_json(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON: non-finite floats, bytes and other objects become short text."""
    if depth > 8:
        return "..."
    if isinstance(value, str):
        return value[:4000].encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -MAX_INT64 <= value <= MAX_INT64 else str(value)[:50]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(safe_json(k, depth + 1)): safe_json(v, depth + 1)
                for k, v in list(value.items())[:200]}
    if isinstance(value, list | tuple):
        return [safe_json(v, depth + 1) for v in list(value)[:200]]
    return safe_json(repr(value)[:200], depth + 1)
