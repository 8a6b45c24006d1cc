"""Datasets and timed traces: formats, record-by-record checks, tokenizing, replay."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from autotuner.cli.check import check_main
from autotuner.cli.main import main
from autotuner.engines import registry
from autotuner.measure.bench import build_plan
from autotuner.models import synth
from autotuner.sla.spec import SlaError, load_sla, parse_sla
from autotuner.workload import datafiles
from autotuner.workload.datafiles import DataFileError
from autotuner.workload.datasets import DatasetReplay, prepare, read_dataset
from autotuner.workload.replay import trace_deadline
from autotuner.workload.requests import Arrival, LengthDist, PromptSource
from autotuner.workload.traces import TraceReplay, read_trace

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "objectives" / "examples"
OUT = LengthDist.fixed(16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth.synthesize("tiny-llama", tmp_path_factory.mktemp("m") / "tiny-llama")


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, *records: object) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


# --------------------------------------------------------------------------- datasets


def test_the_sample_datasets_read_in_their_formats() -> None:
    kinds = {
        name: read_dataset(EXAMPLES / name)
        for name in ("prompts.jsonl", "chat.jsonl", "sharegpt.json")
    }
    assert {n: k for n, (k, _) in kinds.items()} == {
        "prompts.jsonl": "prompts",
        "chat.jsonl": "openai-chat",
        "sharegpt.json": "sharegpt",
    }
    _, chat = kinds["chat.jsonl"]
    # A two-exchange record: the request is everything up to the last user turn.
    two = next(r for r in chat if len(r.messages) == 4)
    assert [role for role, _ in two.messages] == ["system", "user", "assistant", "user"]
    _, share = kinds["sharegpt.json"]
    assert share[0].messages[0] == ("system", "Keep answers short.")
    assert share[0].messages[-1][0] == "user" and share[0].reply


def test_openai_chat_reply_after_the_last_user_turn_gives_the_output_length(
    tmp_path: Path, tiny: Path
) -> None:
    path = jsonl(
        tmp_path / "c.jsonl",
        {"messages": [{"role": "user", "content": "a b c"}]},
        {
            "messages": [
                {"role": "user", "content": "a b"},
                {"role": "assistant", "content": "x y z w"},
            ]
        },
        {"messages": [{"role": "user", "content": "a"}], "output_tokens": 7},
    )
    data = prepare(path, "auto", tiny, "chat", 1024, 50)
    assert [p.output_tokens for p in data.prompts] == [None, 4, 7]
    replay = DatasetReplay(data, seed=0)
    specs = [replay.make(i, 0, OUT) for i in range(3)]
    # Each prompt once per pass, in an order drawn from the seed; None takes the workload's.
    assert sorted(s.output_tokens for s in specs) == [4, 7, 16]


@pytest.mark.parametrize(
    ("name", "text", "where", "phrase"),
    [
        (
            "c.jsonl",
            '{"messages": [{"role": "user", "content": "hi"}]}\n'
            '{"messages": [{"role": "system", "content": "only"}]}\n',
            ":2:",
            "no user turn",
        ),
        (
            "s.json",
            json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]),
            ": record 1:",
            "no user turn",
        ),
        ("p.jsonl", '{"prompt": 5}\n', ":1:", "'prompt' must be non-empty text"),
        ("p.jsonl", '{"prompt": "a", "output_tokens": "5"}\n', ":1:", "must be an integer"),
        ("p.jsonl", '{"prompt": "a", "output_tokens": true}\n', ":1:", "must be an integer"),
        ("p.jsonl", '{"prompt": "a", "output_tokens": NaN}\n', ":1:", "not a number JSON"),
        ("p.jsonl", '{"prompt": "a"}\n[1, 2]\n', ":2:", "must be a JSON object"),
        ("p.jsonl", '{"text": "a"}\n', ":1:", "unknown dataset format"),
        ("p.txt", '{"prompt": "a"}\n', ":", "unknown dataset format"),
        ("p.jsonl", "[" * 100_000 + "\n", ":1:", "nested too deeply"),
        ("p.jsonl", '{"prompt": "a"}\n{"prompt": \n', ":2:", "not JSON"),
        # issue 40: Python kept the last of two keys, and said its own words for the rest
        ("p.jsonl", '{"prompt": "a", "prompt": "b"}\n', ":1:", 'duplicate key "prompt"'),
        (
            "p.jsonl",
            '{"prompt": "a", "output_tokens": ' + "9" * 5000 + "}\n",
            ":1:",
            "an integer of more than 4300 digits",
        ),
        (
            "c.jsonl",
            '{"messages": [{"role": "user", "content": [{"type": "image"}]}]}\n',
            ":1:",
            "content must be text",
        ),
    ],
)
def test_bad_dataset_records_name_their_line_or_record(
    tmp_path: Path, name: str, text: str, where: str, phrase: str
) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(DataFileError) as info:
        read_dataset(path)
    assert f"{path}{where}" in str(info.value) or f"{name}{where}" in str(info.value)
    assert phrase in str(info.value)


def test_hostile_bytes_and_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = write(tmp_path / "p.jsonl", b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n')
    with pytest.raises(DataFileError, match=r"p\.jsonl:2: not UTF-8"):
        read_dataset(bad)
    monkeypatch.setattr(datafiles, "MAX_LINE_BYTES", 64)
    long = write(tmp_path / "q.jsonl", '{"prompt": "a"}\n' + json.dumps({"prompt": "x" * 200}))
    with pytest.raises(DataFileError, match=r"q\.jsonl:2: line longer than 64 bytes"):
        read_dataset(long)
    monkeypatch.setattr(datafiles, "MAX_FILE_BYTES", 10)
    with pytest.raises(DataFileError, match="more than the 10 allowed"):
        read_dataset(tmp_path / "p.jsonl")


def test_prompts_are_counted_with_the_model_tokenizer_and_too_long_ones_dropped(
    tmp_path: Path, tiny: Path
) -> None:
    words = synth.vocab_words(tiny)[20:]
    path = jsonl(
        tmp_path / "p.jsonl",
        *({"prompt": " ".join(words[:n])} for n in (10, 100, 995, 1000, 30)),
    )
    data = prepare(path, "auto", tiny, "completions", 1024, 32)
    # The synth tokenizer is one word, one token: 995 + 32 and 1000 + 32 are over 1024.
    assert sorted(p.input_tokens for p in data.prompts) == [10, 30, 100]
    assert (data.records, data.dropped) == (5, 2)
    assert "5 records, 2 dropped" in data.note() and "1024" in data.note()
    chat = prepare(path, "auto", tiny, "chat", None, 32)
    # For chat the template counts: the synth template puts no tokens around one message.
    assert chat.dropped == 0 and "chat template" in chat.rendering
    with pytest.raises(DataFileError, match="no prompt fits"):
        prepare(path, "auto", tiny, "completions", 8, 4)


def test_without_a_chat_template_messages_are_joined(tmp_path: Path, tiny: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny.iterdir():
        (model / f.name).symlink_to(f)
    (model / "tokenizer_config.json").unlink()
    write(model / "tokenizer_config.json", "{}")
    path = jsonl(
        tmp_path / "c.jsonl",
        {"messages": [{"role": "system", "content": "a b"}, {"role": "user", "content": "c"}]},
    )
    data = prepare(path, "auto", model, "completions", None, 8)
    assert "no chat template" in data.rendering
    assert data.prompts[0].text == "a b\n\nc"


def test_the_order_depends_on_the_seed_and_levels_take_the_next_prompts(
    tmp_path: Path, tiny: Path
) -> None:
    path = jsonl(tmp_path / "p.jsonl", *({"prompt": f"p{i}"} for i in range(20)))
    data = prepare(path, "auto", tiny, "completions", None, 8)

    def order(seed: int, first: int) -> list[object]:
        replay = DatasetReplay(data, seed)
        return [replay.make(i, first, OUT).prompt for i in range(10)]

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(1, 0)
    # Level 2 starts where level 1 stopped: 20 prompts, two levels of 10, no repeat.
    assert set(order(0, 0)).isdisjoint(order(0, 10))


# --------------------------------------------------------------------------- traces


def test_mooncake_blocks_with_the_same_hash_id_are_the_same_tokens(tiny: Path) -> None:
    trace = read_trace(EXAMPLES / "mooncake-trace.jsonl")
    replay = TraceReplay(trace, PromptSource.from_model_dir(tiny), "completions", seed=0)
    recs = trace.records
    specs = [replay.make(i, 0, OUT) for i in range(len(recs))]
    for r, s in zip(recs, specs, strict=True):
        assert isinstance(s.prompt, list) and len(s.prompt) == r.input_tokens == s.input_tokens
        assert s.output_tokens == r.output_tokens
    block = trace.block_tokens
    for (ra, sa), (rb, sb) in itertools.combinations(zip(recs, specs, strict=True), 2):
        assert isinstance(sa.prompt, list) and isinstance(sb.prompt, list)
        for k, (ha, hb) in enumerate(zip(ra.hash_ids, rb.hash_ids, strict=False)):
            end = min(block * (k + 1), ra.input_tokens, rb.input_tokens)
            same = sa.prompt[block * k : end] == sb.prompt[block * k : end]
            assert same == (ha == hb), (ra.line, rb.line, k)
    # Another load level (first index) or pass builds other tokens: no cache hit across them.
    again = replay.make(0, 24, OUT)
    assert isinstance(again.prompt, list) and again.prompt[:block] != specs[0].prompt[:block]
    assert replay.make(len(recs), 0, OUT).prompt != specs[0].prompt


def test_trace_times_scale_with_the_speed_and_wrap(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,10,2\n"
        "2023-11-16 18:15:47.6805900,20,3\n"
        "2023-11-16 18:15:49.6805900,30,4\n",
    )
    trace = read_trace(path)
    assert [r.time_s for r in trace.records] == pytest.approx([0, 1, 3])
    assert [r.input_tokens for r in trace.records] == [10, 20, 30]
    assert list(itertools.islice(trace.offsets(2.0), 5)) == pytest.approx([0, 0.5, 1.5, 2.25, 2.75])
    replay = TraceReplay(trace, PromptSource(1000), "completions", 0)
    assert trace_deadline(replay, 3, 2.0) == pytest.approx(1.5)
    assert trace_deadline(replay, 5, 1.0) == pytest.approx(5.5)
    secs = write(
        tmp_path / "s.csv", "timestamp,context_tokens,generated_tokens,x\n5,1,1,a\n7.5,2,2,b\n"
    )
    assert [r.time_s for r in read_trace(secs).records] == [0, 2.5]


@pytest.mark.parametrize(
    ("name", "text", "line", "phrase"),
    [
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n4,1,1\n", 3, "back in time"),
        (
            "t.jsonl",
            '{"timestamp": 10, "input_length": 5, "output_length": 1}\n'
            '{"timestamp": 9, "input_length": 5, "output_length": 1}\n',
            2,
            "back in time",
        ),
        ("t.csv", "time,in,out\n1,2,3\n", 1, "unknown trace format"),
        ("t.jsonl", '{"ts": 1, "input_length": 5, "output_length": 1}\n', 1, "unknown trace"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,-5,1\n", 2, "must be an integer"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", 2, "TIMESTAMP"),
        (
            "t.jsonl",
            '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}\n',
            1,
            "more than input_length 600 holds",
        ),
        (
            "t.jsonl",
            '{"timestamp": 1, "input_length": 6, "output_length": 1, "hash_ids": ["a"]}\n',
            1,
            "hash id must be an integer",
        ),
    ],
)
def test_bad_trace_records_name_their_line(
    tmp_path: Path, name: str, text: str, line: int, phrase: str
) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(DataFileError) as info:
        read_trace(path)
    assert str(info.value).startswith(f"{path}:{line}: "), info.value
    assert phrase in str(info.value)


def test_a_trace_record_longer_than_the_context_is_refused() -> None:
    trace = read_trace(EXAMPLES / "mooncake-trace.jsonl")
    trace.fits(1024)
    with pytest.raises(DataFileError, match=r"mooncake-trace\.jsonl:1: 860 input \+ 13 output"):
        trace.fits(800)


# --------------------------------------------------------------------------- check


def _check(sla: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = check_main([str(sla)])
    return code, capsys.readouterr().err


SLA = """name: t
model: {{synth: tiny-llama}}
engine: {{params: {{max_model_len: 1024}}}}
workload:
  {source}
  arrival: {arrival}
  requests: 10
"""


@pytest.mark.parametrize(
    ("source", "arrival", "data", "phrase"),
    [
        (
            "trace: t.jsonl",
            "{process: trace, speed: 2}",
            '{"timestamp": 5, "input_length": 5, "output_length": 1}\n'
            '{"timestamp": 1, "input_length": 5, "output_length": 1}\n',
            "t.jsonl:2: timestamp goes back in time",
        ),
        (
            "trace: t.csv",
            "{process: trace}",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n1,1000,100\n",
            "t.csv:2: 1000 input + 100 output tokens do not fit",
        ),
        (
            "dataset: d.jsonl",
            "{process: poisson, rate: 1}",
            '{"prompt": "a", "output_tokens": 1024}\n',
            "d.jsonl: line 1: output_tokens 1024 leaves no room for a prompt",
        ),
        (
            "dataset: d.jsonl",
            "{process: poisson, rate: 1}",
            '{"messages": [{"role": "assistant", "content": "a"}]}\n',
            "d.jsonl:1: the conversation has no user turn",
        ),
        ("dataset: d.parquet", "{process: poisson, rate: 1}", "PAR1", "unknown dataset format"),
        ("trace: t.jsonl", "{process: poisson, rate: 1}", "", "a trace goes with"),
    ],
)
def test_check_exits_2_naming_the_data_file_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    source: str,
    arrival: str,
    data: str,
    phrase: str,
) -> None:
    write(tmp_path / source.split(": ")[1], data)
    sla = write(tmp_path / "t.yaml", SLA.format(source=source, arrival=arrival))
    code, err = _check(sla, capsys)
    assert code == 2, err
    assert phrase in err, err
    assert f"{sla}:" in err  # the SLA's own line too


@pytest.mark.parametrize(
    ("workload", "phrase"),
    [
        (
            "{trace: t.csv, input_tokens: 5, arrival: {process: trace}}",
            "exactly one of 'input_tokens', 'dataset' or 'trace'",
        ),
        ("{input_tokens: 5, output_tokens: 1, arrival: {process: trace}}", "a trace goes with"),
        ("{trace: t.csv, arrival: {process: trace, speed: 0}}", "must be >= 0.001"),
        ("{trace: t.csv, trace_format: parquet, arrival: {process: trace}}", "one of auto"),
    ],
)
def test_trace_fields_are_checked_in_the_sla(workload: str, phrase: str) -> None:
    text = f"model: {{synth: tiny-llama}}\nworkload: {workload}\n"
    with pytest.raises(SlaError) as info:
        parse_sla(text)
    assert phrase in str(info.value)
    assert "<string>:2: workload" in str(info.value)


def test_check_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for sla in ("sharegpt-cpu.yaml", "mooncake-cpu.yaml"):
        code, err = _check(EXAMPLES / sla, capsys)
        assert code == 0, err


# --------------------------------------------------------------------------- plans


def _sla_file(tmp_path: Path, tiny: Path, workload: str) -> Path:
    return write(
        tmp_path / "s.yaml",
        f"name: s\nmodel: {{path: {tiny}}}\nengine: {{params: {{max_model_len: 1024}}}}\n"
        f"workload: {workload}\n",
    )


def test_a_trace_plan_replays_the_trace_at_the_level_speed(tmp_path: Path, tiny: Path) -> None:
    sla = load_sla(
        _sla_file(
            tmp_path, tiny, f"{{trace: {EXAMPLES}/azure-trace.csv, arrival: {{process: trace}}}}"
        )
    )
    roles = registry.get(sla.engine.kind).roles
    plan = build_plan(sla, tiny, Arrival("trace", rate=2.0), level=1, roles=roles)
    trace = read_trace(EXAMPLES / "azure-trace.csv")
    assert plan.requests == len(trace.records)  # no requests given: the trace once
    times = [r.time_s / 2 for r in trace.records]
    assert list(itertools.islice(plan.offsets(), len(times))) == pytest.approx(times)
    # The deadline covers the replay: the last request leaves at its time / speed.
    assert plan.hard_deadline() == pytest.approx(times[-1] + sla.workload.request_timeout_s)
    assert plan.arrival.describe() == "trace at 2x speed"
    assert [plan.factory.make(i).input_tokens for i in range(3)] == [
        r.input_tokens for r in trace.records[:3]
    ]


def test_tune_refuses_a_dataset_with_no_prompt_that_fits_before_launching(
    tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jsonl(tmp_path / "long.jsonl", {"prompt": " ".join(["w"] * 1100)})
    sla = _sla_file(
        tmp_path,
        tiny,
        "{dataset: long.jsonl, arrival: {process: poisson, rate: 1}, requests: 4}",
    )
    trials = tmp_path / "trials"
    code = main(["tune", str(sla), "--trials-dir", str(trials)])
    assert code == 2
    assert "long.jsonl: no prompt fits" in capsys.readouterr().err
    assert not trials.exists()  # no study, no launch


def test_check_warns_when_a_trace_is_too_short_for_the_percentile(
    tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = f"{EXAMPLES}/mooncake-trace.jsonl"
    sla = _sla_file(tmp_path, tiny, f"{{trace: {trace}, arrival: {{process: trace}}}}")
    sla.write_text(sla.read_text() + "constraints: {p90_ttft_ms: 1000}\n")
    assert check_main([str(sla)]) == 0
    assert "replays the trace's 24 records once: set workload.requests to 29" in (
        capsys.readouterr().err
    )
    sla.write_text(sla.read_text().replace("process: trace}", "process: trace}, requests: 29"))
    assert check_main([str(sla)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_defaults_sentence_uses_the_unit_capacity_was_measured_in() -> None:
    from types import SimpleNamespace

    from autotuner.search.progress import _capacity_unit

    trace = SimpleNamespace(capacity=SimpleNamespace(unit="x trace speed"))
    assert _capacity_unit([(None, SimpleNamespace(capacity=None)), (None, trace)]) == (
        "x trace speed"
    )
    assert _capacity_unit([]) == "req/s"


NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"


@pytest.mark.parametrize(
    ("template", "phrase"),
    [
        (NESTED, "rendering ran past 1 s"),  # issue 40: tune printed nothing for 90 s
        ("{% for i in range(99999) %}{{ 'y' * 99999 }}{% endfor %}", "more than"),
        ("{{ 'x' * 10**10 }}", "a repeat of 10000000000"),
    ],
)
def test_tune_stops_a_runaway_chat_template_with_exit_2_naming_its_file(
    template: str,
    phrase: str,
    tmp_path: Path,
    tiny: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from autotuner.workload import chat_render

    monkeypatch.setattr(chat_render, "SECONDS", 1.0)  # the bound, made short for the test
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny.iterdir():
        if f.name != "tokenizer_config.json":
            (model / f.name).symlink_to(f)
    config = write(model / "tokenizer_config.json", json.dumps({"chat_template": template}))
    jsonl(tmp_path / "chat.jsonl", {"messages": [{"role": "user", "content": "hello"}]})
    sla = _sla_file(
        tmp_path,
        model,
        "{dataset: chat.jsonl, arrival: {process: poisson, rate: 1}, requests: 4}",
    )
    trials = tmp_path / "trials"
    started = time.monotonic()
    assert main(["tune", str(sla), "--trials-dir", str(trials)]) == 2
    assert time.monotonic() - started < 60  # a bound against the hang, not a timing
    err = capsys.readouterr().err
    assert f"error: {config}: chat template: " in err and phrase in err
    assert "chat.jsonl: line 1" in err
    assert not trials.exists()  # no study, no launch


def test_a_byte_order_mark_before_a_dataset_is_skipped(tmp_path: Path) -> None:
    # issue 40: Python's "Unexpected UTF-8 BOM" for a file an editor saved with one
    path = write(tmp_path / "p.jsonl", '\ufeff{"prompt": "a b"}\n')
    kind, rows = read_dataset(path)
    assert kind == "prompts" and [r.prompt for r in rows] == ["a b"]
