"""The daemon refuses what `autotuner check` refuses, with the same messages (issue 27, 4).

Before, `p99.99999999999_ttft_ms` was queued (201) and then crashed `check` and `tune`; a rate
of 1e-300, a level of 83 hours and a grid of 27 billion points were queued just the same.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autotuner.cli.main import main
from autotuner.daemon.api import make_app
from autotuner.daemon.service import Daemon

SLA = """\
name: {name}
model: {{synth: tiny-llama}}
engine: {{kind: vllm, name: eng-a}}
target: cpu
workload:
  input_tokens: 16
  output_tokens: 8
  arrival: {{process: poisson, rate: 2}}
  requests: 20
constraints:
  p99_ttft_ms: 500
"""


def _grid(values: int) -> str:
    lists = {"max_num_seqs": 1, "max_num_batched_tokens": 4096, "block_size": 1}
    rows = "".join(
        f"    {name}: {{values: [{', '.join(str(start + i) for i in range(values))}]}}\n"
        for name, start in lists.items()
    )
    return f"search:\n  params:\n{rows}tune: {{sampler: grid}}\n"


CASES = {
    "tiny-rate": ("rate: 2}", "rate: 1.0e-300}", "must be >= 0.001, got 1e-300"),
    "slow-level": ("rate: 2}", "rate: 0.001}", "planned to take 3.46 days (299,000 s)"),
    "percentile": (
        "p99_ttft_ms: 500",
        "p99.99999999999_ttft_ms: 500",
        "percentile 99.99999999999 has 11 decimals",
    ),
    "grid": ("p99_ttft_ms: 500\n", "p99_ttft_ms: 500\n" + _grid(3000), "27,000,000,000 points"),
}


def _checked(tmp_path: Path, name: str, text: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What `autotuner check` says about ``text``, each line as the daemon names the source."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    assert main(["check", str(path)]) == 2
    return capsys.readouterr().err.replace(str(path), f"{name}.yaml").splitlines()


def test_the_daemon_refuses_what_check_refuses_with_its_messages(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = {}
    for name, (old, new, _) in CASES.items():
        base = SLA.format(name=name)
        assert old in base
        texts[name] = base.replace(old, new)
    expected = {name: _checked(tmp_path, name, text, capsys) for name, text in texts.items()}

    async def go() -> dict[str, tuple[int, list[str]]]:
        client = TestClient(TestServer(make_app(daemon)))
        await client.start_server()
        got: dict[str, tuple[int, list[str]]] = {}
        try:
            h = {"Authorization": f"Bearer {daemon.token}", "Content-Type": "application/yaml"}
            for name, text in texts.items():
                r = await client.post(f"/v1/studies?source={name}.yaml", data=text, headers=h)
                got[name] = (r.status, (await r.json())["errors"])
            ok = await client.post("/v1/studies", data=SLA.format(name="fine"), headers=h)
            got["fine"] = (ok.status, [])
        finally:
            await client.close()
        return got

    got = asyncio.run(asyncio.wait_for(go(), 120))  # a bound against a hang only
    assert got.pop("fine")[0] == 201
    for name, (status, errors) in got.items():
        assert status in (400, 422), (name, status, errors)
        assert errors == expected[name], name
        assert CASES[name][2] in errors[0], (name, errors)
    assert {r.name for r in daemon.store.slas()} == {"fine"}
