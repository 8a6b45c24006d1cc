"""An engine start says it is still under way, instead of nothing for up to minutes (issue 29)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from autotuner.engines.base import Endpoint, EngineLaunchError, LaunchCause
from autotuner.engines.process import launch_saying


class _Slow:
    """An engine that takes ``seconds`` to start, or fails after them."""

    def __init__(self, seconds: float, fail: bool = False) -> None:
        self.seconds, self.fail = seconds, fail

    async def launch(self) -> Endpoint:
        await asyncio.sleep(self.seconds)
        if self.fail:
            raise EngineLaunchError(LaunchCause.TIMEOUT, "not healthy", "", None)
        return Endpoint("http://127.0.0.1:1", "m", 1, ("x",), Path("log"), self.seconds)


def _run(engine: Any, said: list[str]) -> Endpoint:
    async def go() -> Endpoint:
        out = await launch_saying(engine, said.append, indent="  ", every_s=0.1)
        await asyncio.sleep(0.3)  # nothing more is said once the engine is up
        return out

    return asyncio.run(go())


def test_a_slow_start_is_reported_while_it_runs_and_not_after() -> None:
    said: list[str] = []
    endpoint = _run(_Slow(0.35), said)
    assert endpoint.base_url == "http://127.0.0.1:1"
    assert 2 <= len(said) <= 4, said
    assert all(s.startswith("  engine starting, ") and s.endswith(" s ...") for s in said)


def test_a_quick_start_says_nothing_and_a_failed_one_stops_saying() -> None:
    said: list[str] = []
    _run(_Slow(0.0), said)
    assert said == []
    with pytest.raises(EngineLaunchError):
        _run(_Slow(0.15, fail=True), said)
    assert 1 <= len(said) <= 2, said
