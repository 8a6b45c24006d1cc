"""JSON as users hand it over, read strictly: a duplicate key is an error (Python keeps the
last one silently), a leading byte-order mark is skipped (editors on Windows write one), and
what Python refuses (an integer of thousands of digits, NaN) is said in the file's terms.
Every failure is a ``ValueError`` with a message meant for the user."""

from __future__ import annotations

import json
import sys
from typing import Any

BOM = "\ufeff"


class _Refused(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {json.dumps(key)[:80]}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number JSON allows")


def loads(text: str) -> Any:
    """The JSON value of ``text``; ``ValueError`` naming the line for anything unusable."""
    try:
        return json.loads(
            text.removeprefix(BOM), object_pairs_hook=_object, parse_constant=_constant
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not usable JSON: nested too deeply") from None
    except _Refused as exc:
        raise ValueError(f"not usable JSON: {exc}") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            limit = sys.get_int_max_str_digits()
            raise ValueError(f"not usable JSON: an integer of more than {limit} digits") from None
        raise ValueError(f"not usable JSON: {exc}") from None
