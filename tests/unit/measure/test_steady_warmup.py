"""Warm-up to steady state before a launch's first level (issue 28, section 1), and the host's
load in the trial record: the rule on its own, then whole launches on an in-process stand-in
server whose first requests are slower (a cold phase), through run_trial and the real load
generator."""

from __future__ import annotations

import contextlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from autotuner.engines import registry
from autotuner.engines.base import Endpoint
from autotuner.measure.steady import SteadyRule, Window, describe, rule_of, settled, window_of
from autotuner.search import trial as trial_mod
from autotuner.search.trial import SearchSettings, TrialResult, run_trial
from autotuner.sla.spec import Sla, parse_sla
from autotuner.testing.standin import StandinConfig, StandinServer


def adapter_kw(sla: Sla) -> dict[str, Any]:
    """run_trial's engine adapter, where its signature takes one (the adapter is being
    threaded through run_trial; both forms run these tests)."""
    if "adapter" in inspect.signature(run_trial).parameters:
        return {"adapter": registry.get(sla.engine.kind)}
    return {}


RULE = SteadyRule(window=5, min_windows=2, tolerance=0.1, max_requests=100, max_s=30)


def test_latency_still_falling_is_not_steady_rising_or_flat_is() -> None:
    falling = [Window(20.0, 200.0), Window(12.0, 150.0)]
    assert not settled(falling, RULE)
    assert settled([Window(10.0, 100.0), Window(9.5, 95.0)], RULE)  # within the tolerance
    # Near capacity random arrivals move a window's TPOT up a lot: that is the load, not a
    # cold engine, and does not prolong the warm-up.
    assert settled([Window(10.0, 100.0), Window(21.0, 180.0)], RULE)
    assert not settled([Window(10.0, 100.0), Window(9.9, 50.0)], RULE)  # TTFT still falling
    assert not settled([Window(10.0, 100.0)], RULE)  # one window compares with nothing
    assert not settled([Window(10.0, 100.0), Window(None, None, failed=5)], RULE)


def test_a_window_is_the_median_of_its_successful_requests() -> None:
    w = window_of([(0.010, 0.1, True), (0.011, 0.2, True), (0.5, 5.0, True), (None, None, False)])
    assert w.tpot_ms == pytest.approx(11.0) and w.ttft_ms == pytest.approx(200.0)
    assert w.failed == 1


def test_the_rule_comes_from_the_sla_with_warmup_requests_as_floor() -> None:
    sla = parse_sla(sla_text("p90_tpot_ms: 50", warmup=60))
    rule = rule_of(sla, 30)
    assert rule is not None and rule.floor == 60 and rule.window == 7 and rule.least == 60
    big = rule_of(sla, 600)
    assert big is not None and big.window == 25
    off = parse_sla(sla_text("p90_tpot_ms: 50", tune="warmup: {max_requests: 0}"))
    assert rule_of(off, 30) is None
    said = describe(
        {"requests": 200, "seconds": 60.0, "steady": False, "stopped_by": "max_s", "load": "x"}
    )
    assert "not steady (the time bound ended it)" in said


def sla_text(constraints: str, warmup: int = 0, tune: str = "") -> str:
    return f"""
name: warmup-unit
model: {{synth: tiny-llama}}
target: cpu
workload:
  input_tokens: 8
  output_tokens: 8
  arrival: {{process: poisson, rate: 10}}
  requests: 30
  warmup_requests: {warmup}
constraints: {{{constraints}}}
tune: {{max_levels: 2, {tune}}}
"""


class StandinEngine:
    """An engine whose launch starts an in-process stand-in server (in run_trial's loop)."""

    def __init__(self, log_path: Path, config: StandinConfig) -> None:
        self.log_path = log_path
        self.cuda_devices = None
        self.config = config
        self._stack = contextlib.AsyncExitStack()

    def processes(self) -> list[Any]:
        return []

    def argv(self) -> list[str]:
        return ["standin"]

    async def launch(self) -> Endpoint:
        server = await self._stack.enter_async_context(StandinServer(self.config))
        return Endpoint(server.base_url, self.config.model, 1, ("standin",), self.log_path, 0.1)

    async def stop(self) -> None:
        await self._stack.aclose()

    def returncode(self) -> int | None:
        return None


def launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: StandinConfig, tune: str = ""
) -> TrialResult:
    monkeypatch.setattr(
        trial_mod,
        "make_engine",
        lambda sla, py, md, p, log, cuda, engine=None: StandinEngine(log, config),
    )
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    sla = parse_sla(sla_text("p90_tpot_ms: 50", tune=tune))
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    return run_trial(
        {},
        sla,
        python=Path("python"),
        model_dir=model,
        run_dir=run_dir,
        cuda_devices=None,
        **adapter_kw(sla),
        settings=SearchSettings.of(sla),
        say=lambda s: None,
    )


WARM = StandinConfig(model="m", ttft_s=0.005, itl_s=0.003)
# The first 20 requests slower: the first 30 x (TPOT 90 ms against the SLA's 50), the 9th
# still 50 ms, falling to 1 x (3 ms, well clear of the limit on a busy 2-core host).
COLD = StandinConfig(model="m", ttft_s=0.005, itl_s=0.003, cold_requests=20, cold_factor=30.0)


def test_a_cold_server_gives_the_capacity_of_a_warm_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warm = launch(tmp_path, monkeypatch, WARM)
    cold = launch(tmp_path, monkeypatch, COLD)
    assert warm.capacity is not None and cold.capacity is not None
    assert warm.capacity.low == 15.0  # both levels met: 10, then 15 req/s (max_levels 2)
    assert cold.capacity.value == warm.capacity.value
    record = TrialResult.read(tmp_path / "run-1" / "trial.json")
    first = record.levels[0].warmup
    assert first is not None and first["steady"] and first["stopped_by"] == "steady"
    assert first["requests"] >= 20 and first["seconds"] > 0  # it waited out the cold phase
    assert first["load"] == "poisson 10 req/s"  # at the first level's own rate
    assert record.levels[1].warmup is None  # a later level on the same engine: none
    # Without the warm-up (the code as it was: workload.warmup_requests only), the cold phase
    # lands in the first level, which misses: capacity 0.
    old = launch(tmp_path, monkeypatch, COLD, tune="warmup: {max_requests: 0}")
    assert old.capacity is not None and old.capacity.value == 0.0


def test_a_launch_records_the_hosts_load_before_and_during(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = launch(tmp_path, monkeypatch, WARM)
    host = TrialResult.read(tmp_path / "run-0" / "trial.json").extra["host"]
    assert host == result.extra["host"]
    assert host["cores"] >= 1 and isinstance(host["busy"], bool)
    assert set(host["before"]) == {"load1", "others_share"}
    assert host["before"]["others_share"] >= 0 and host["before"]["load1"] >= 0
    assert host["during"]["samples"] >= 1 and host["during"]["others_share_mean"] >= 0


def test_a_warmup_that_never_settles_stops_at_its_bound_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 requests at most, fewer than the two windows of 7 the rule compares: the bound ends it.
    launch(tmp_path, monkeypatch, COLD, tune="warmup: {max_requests: 12}")
    warm = TrialResult.read(tmp_path / "run-0" / "trial.json").levels[0].warmup
    assert warm is not None
    assert (warm["requests"], warm["steady"], warm["stopped_by"]) == (12, False, "max_requests")
    assert "not steady (the request bound ended it)" in describe(warm)


def test_a_warmup_whose_requests_all_fail_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = StandinConfig(model="m", ttft_s=0.005, itl_s=0.003, fail_every=1)  # all HTTP 500
    result = launch(tmp_path, monkeypatch, failing)
    warm = result.levels[0].warmup
    assert warm is not None and warm["stopped_by"] == "failed" and not warm["steady"]
    assert warm["requests"] < 30 and warm["failed"] == warm["requests"]  # one window, not 200
    assert "a whole window of its requests failed" in describe(warm)
