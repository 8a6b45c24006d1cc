"""One allow-list and one merge for every source of a launch's options: ``engine.params``,
``engine.args``, the search space (``search.params``, ``search.baseline``) and ``bench --set``.

Was: ``engine.args: ["--max-num-seqs", "3"]`` next to a searched ``max_num_seqs`` passed
``check``; the trial recorded 64 and the engine ran ``--max-num-seqs 64 ... --max-num-seqs 3``
(the last one wins in vLLM's argparse), and ``bench --set`` reached the engine unchecked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotuner.cli.main import main
from autotuner.sla.allowed import override_problems
from autotuner.sla.spec import Sla, SlaError, parse_sla
from autotuner.testing.standin import write_engine_python

BASE: dict[str, Any] = {
    "name": "settings",
    "model": {"synth": "tiny-llama"},
    "engine": {"kind": "vllm"},
    "target": "cpu",
    "workload": {
        "input_tokens": 8,
        "output_tokens": 4,
        "arrival": {"process": "poisson", "rate": 1},
        "requests": 8,
    },
    "constraints": {"p50_ttft_ms": 1000},
}


def _sla(engine: dict[str, Any] | None = None, search: dict[str, Any] | None = None) -> Sla:
    data = {**BASE, "engine": {"kind": "vllm", **(engine or {})}}
    if search is not None:
        data["search"] = search
    return parse_sla(yaml.safe_dump(data), "settings.yaml")


def _refused(engine: dict[str, Any], search: dict[str, Any] | None = None) -> str:
    with pytest.raises(SlaError) as err:
        _sla(engine, search)
    return str(err.value)


def test_engine_args_are_options_merged_with_engine_params() -> None:
    sla = _sla(
        {
            "params": {"enforce_eager": True},
            "args": ["--max-num-seqs", "3", "--no-enable-prefix-caching", "--block-size=32"],
        }
    )
    assert sla.engine.settings() == {
        "enforce_eager": True,
        "max_num_seqs": 3,
        "enable_prefix_caching": False,
        "block_size": 32,
    }


def test_an_option_fixed_by_args_may_not_be_searched_nor_set_twice() -> None:
    searched = {"params": {"max_num_seqs": {"values": [8, 64]}}}
    text = _refused({"args": ["--max-num-seqs", "3"]}, searched)
    assert "search.params.max_num_seqs" in text and "engine.args" in text
    text = _refused({"params": {"max_num_seqs": 4}, "args": ["--max-num-seqs", "3"]})
    assert "engine.args[0]" in text and "also set in engine.params" in text
    text = _refused({"args": ["--max-num-seqs", "3", "--max_num_seqs=4"]})
    assert "engine.args[2]" in text and "set twice" in text


def test_declared_choices_hold_for_every_source() -> None:
    assert "kv_cache_dtype" in _refused({"params": {"kv_cache_dtype": "fp9"}})
    assert "must be one of" in _refused({"args": ["--kv-cache-dtype", "fp9"]})
    text = _refused(
        {},
        {"params": {"kv_cache_dtype": {"values": ["auto"]}}, "baseline": {"kv_cache_dtype": "fp9"}},
    )
    assert "search.baseline.kv_cache_dtype" in text and "must be one of" in text
    assert override_problems("vllm", {"kv_cache_dtype": "fp9"})[0].startswith(
        "--set kv_cache_dtype: must be one of"
    )
    (why,) = override_problems("vllm", {"trust_remote_code": True})
    assert "not an option an SLA may set" in why
    assert "cannot be set here" in override_problems("vllm", {"port": 1})[0]
    assert override_problems("vllm", {"max_num_seqs": 8, "quantization": None}) == []


def test_bench_set_goes_through_the_allow_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(BASE))
    argv = ["bench", str(path), "--trials-dir", str(tmp_path), "--set", "trust_remote_code=true"]
    assert main(argv) == 2  # refused before anything runs
    assert "--set trust_remote_code: not an option an SLA may set" in capsys.readouterr().err


def test_bench_runs_each_option_once_with_the_value_it_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine.args and --set merged with engine.params: one word per option on the command
    line that ran (the stand-in records it), the same values in result.json."""
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    python = write_engine_python(tmp_path / "python", record=tmp_path / "launches")
    data = {
        **BASE,
        "engine": {
            "kind": "vllm",
            "python": str(python),
            "params": {"block_size": 64},
            "args": ["--max-num-seqs", "3", "--enforce-eager"],
        },
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "result.json"
    argv = ["bench", str(path), "--trials-dir", str(tmp_path), "-o", str(out)]
    assert main([*argv, "--set", "block_size=32"]) == 0
    (launch,) = [json.loads(f.read_text()) for f in (tmp_path / "launches").iterdir()]
    ran = launch["argv"]
    for flag, value in (("--max-num-seqs", "3"), ("--block-size", "32")):
        assert ran.count(flag) == 1 and ran[ran.index(flag) + 1] == value
    assert ran.count("--enforce-eager") == 1
    result = json.loads(out.read_text())
    assert result["params"] == {"block_size": 32, "max_num_seqs": 3, "enforce_eager": True}
    assert result["argv"][3:] == ran
