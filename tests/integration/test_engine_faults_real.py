"""Wrong verdicts against the real vLLM (CPU build): an engine that cannot start, and one that
dies in the middle of a level, are engine failures (exit 3), never an SLA verdict; options
given as ``engine.args`` reach vLLM once, with the value recorded.

Two launches: the first is refused by vLLM itself at start-up (it wants 99 % of the host's
memory, the refusal seen on busy hosts), the second is killed while its load runs. The fast
versions of every fault are on the stand-in (tests/unit/cli/test_engine_faults.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from autotuner.records.outcome import JobOutcome

from .conftest import cpu_sla, run_cli, tagged_processes, wait_until

pytestmark = pytest.mark.slow

WORKLOAD = {
    "input_tokens": 32,
    "output_tokens": 16,
    "arrival": {"process": "poisson", "rate": 2.0},
    "requests": 40,
    "seed": 5,
}


def test_tune_whose_real_engine_refuses_to_start_is_an_engine_failure(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    sla = cpu_sla(
        "it-refused",
        WORKLOAD,
        params={"gpu_memory_utilization": 0.99},  # more than a busy 2-core host has free
        tune={"trials": 1, "max_levels": 1},
    )
    # An explicit KV-cache size would let the engine skip the share's check: ask by share only.
    del sla["engine"]["params"]["kv_cache_memory_bytes"]
    path = tmp_path / "sla.yaml"
    path.write_text(yaml.safe_dump(sla, sort_keys=False))
    out = tmp_path / "outcome.json"
    argv = ["tune", str(path), "--trials-dir", str(tmp_path / "t"), "--outcome", str(out)]
    r = run_cli(argv, cli_env, 600)
    outcome = JobOutcome.read(out)
    assert (r.returncode, outcome.status) == (3, "error"), r.stdout[-3000:] + r.stderr[-3000:]
    assert "the engine failed in every launch (1 of 1)" in r.stderr
    assert "out_of_memory" in r.stderr and "no SLA verdict" in r.stderr


def test_a_real_engine_killed_mid_level_is_a_crash_and_ran_its_args_once(
    tmp_path: Path, cli_env: dict[str, str], tag: str
) -> None:
    sla = cpu_sla("it-crash", WORKLOAD)
    sla["engine"]["args"] = ["--max-num-seqs", "3"]
    path = tmp_path / "sla.yaml"
    path.write_text(yaml.safe_dump(sla, sort_keys=False))
    out = tmp_path / "outcome.json"
    work = tmp_path / "b"
    bench = ["bench", str(path), "--trials-dir", str(work), "--outcome", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotuner", *bench],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def serving() -> bool:  # the engine's access log shows the level's requests
            logs = list(work.glob("*/bench-*/engine.log"))
            return bool(logs) and logs[0].read_text(errors="replace").count("POST /v1/") >= 5

        wait_until(serving, 600, "the level's first requests")
        servers = [
            p
            for p in tagged_processes(tag)
            if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
        ]
        assert servers, "no vLLM server found"
        os.killpg(servers[0].pid, signal.SIGKILL)  # the engine dies in the middle of a level
        said, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    outcome = JobOutcome.read(out)
    assert (proc.returncode, outcome.status) == (3, "error"), said[-4000:]
    assert "the engine crashed while measured: it exited with status -9" in said
    assert "SLA not met" not in said and "NOT met" not in said
    log = next(work.glob("*/bench-*/engine.log")).read_text(errors="replace")
    launched = json.loads(log.splitlines()[0].removeprefix("# autotuner launch: "))
    assert launched.count("--max-num-seqs") == 1  # was --max-num-seqs <default> ... 3
    assert launched[launched.index("--max-num-seqs") + 1] == "3"
    assert "'max_num_seqs': 3" in log  # vLLM's own list of the non-default args it got
    wait_until(lambda: not tagged_processes(tag), 60, "no process left")
    assert not [p for p in psutil.process_iter() if p.pid == servers[0].pid and p.is_running()]
