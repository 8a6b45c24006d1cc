"""Option values compared as YAML and Optuna see them."""

from __future__ import annotations

from autotuner.core.types import same_value


def test_a_switch_is_never_equal_to_a_number() -> None:
    assert not same_value(True, 1) and not same_value(1, True) and not same_value(False, 0)
    assert same_value(True, True) and same_value(0, 0.0) and same_value("fp8", "fp8")
    assert same_value(None, None) and not same_value(None, 0)
