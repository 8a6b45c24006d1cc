"""A value as YAML writes it, for messages and descriptions."""

from __future__ import annotations


def show_value(value: object, *, quote_text: bool = False) -> str:
    """``None`` -> ``null``, booleans -> ``true``/``false``, floats in their shortest form
    (``0.85``, ``1e+06``), anything else as ``str``. ``quote_text`` quotes strings
    (``'fp8'``), for messages where a word could be read as part of the sentence."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if quote_text and isinstance(value, str):
        return repr(value)
    return str(value)
