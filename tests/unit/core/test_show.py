"""show_value: values written as in YAML, with strings quoted only on request."""

from __future__ import annotations

import pytest

from autotuner.core.show import show_value


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (16384, "16384"),
        (0.85, "0.85"),
        (0.8500000000000001, "0.85"),
        (1000000.0, "1e+06"),
        (2.0, "2"),
        ("fp8", "fp8"),
        ("", ""),
    ],
)
def test_values_are_shown_as_yaml_writes_them(value: object, shown: str) -> None:
    assert show_value(value) == shown


def test_quote_text_quotes_strings_and_nothing_else() -> None:
    assert show_value("fp8", quote_text=True) == "'fp8'"
    assert show_value("", quote_text=True) == "''"
    assert show_value(None, quote_text=True) == "null"
    assert show_value(True, quote_text=True) == "true"
    assert show_value(4, quote_text=True) == "4"
    assert show_value(0.5, quote_text=True) == "0.5"
