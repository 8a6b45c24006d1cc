"""Hostile YAML: alias bombs and deep nesting are refused before anything is composed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.core.yamlpos import MAX_NODES, YamlTooLarge, check_bounds, load_located
from autotuner.sla.spec import SlaError, parse_sla


def _alias_bomb(levels: int, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(['"x"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"model: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_at_once() -> None:
    bomb = _alias_bomb(9)  # 9**9 nodes once expanded, from about 430 bytes
    assert len(bomb) < 500
    started = time.monotonic()
    with pytest.raises(SlaError) as err:
        parse_sla(bomb, "bomb.yaml")
    assert time.monotonic() - started < 5  # a bound against a hang, not a speed claim
    assert "aliases expand to more than" in str(err.value)
    assert "bomb.yaml:" in str(err.value)


def test_deep_nesting_is_refused_without_recursion_error() -> None:
    deep = "model: " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(SlaError) as err:
        parse_sla(deep, "deep.yaml")
    assert "nested deeper than 64 levels" in str(err.value)
    deep_map = "".join("  " * i + f"k{i}:\n" for i in range(100)) + "  " * 100 + "v: 1\n"
    with pytest.raises(YamlTooLarge):
        load_located(deep_map)


def test_shared_anchors_within_budget_still_load() -> None:
    # Expands to about MAX_NODES / 2 nodes: legitimate reuse of anchors must keep working.
    width = 50
    levels = 1
    while width ** (levels + 1) < MAX_NODES // 2:
        levels += 1
    text = _alias_bomb(levels, width)
    check_bounds(text)
    data = load_located(text).data
    assert len(data["model"]) == width


def test_bounds_count_expanded_nodes_not_bytes() -> None:
    # Values 11 + 111 + 1111, `model` repeats the last (1111), four keys, the root: 2349 nodes.
    check_bounds(_alias_bomb(3, 10), max_nodes=2349)
    with pytest.raises(YamlTooLarge):
        check_bounds(_alias_bomb(3, 10), max_nodes=2348)


def test_check_command_exits_2_on_a_bomb(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(9))
    assert main(["check", str(bomb)]) == 2
    assert "document too large" in capsys.readouterr().err
