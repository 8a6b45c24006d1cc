"""Absurd arrival rates (issue 40): ``check`` refuses a rate no load generator sends, and
``bench`` at the highest rate it allows, on the stand-in engine, stays small and ends within
seconds of SIGTERM in each phase (its engine stopped). Was: 9.5 GB and 20,000 open files at
1e8 req/s, and still running 4 minutes after SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from autotuner.cli.main import main
from autotuner.sla.bounds import MAX_RATE
from autotuner.testing.standin import write_engine_python

RSS_LIMIT = 500 * 2**20
EXIT_WITHIN_S = 10.0


def _sla(tmp_path: Path, rate: float, python: Path | None = None) -> Path:
    data = {
        "name": "absurd",
        "model": {"synth": "tiny-llama"},
        "engine": {"kind": "vllm", "startup_timeout_s": 60},
        "target": "cpu",
        "workload": {
            "input_tokens": 8,
            "output_tokens": 4,
            "arrival": {"process": "poisson", "rate": rate},
            "requests": 100_000,
        },
        "constraints": {"p50_ttft_ms": 2000},
    }
    if python is not None:
        data["engine"]["python"] = str(python)  # type: ignore[index]
    path = tmp_path / "absurd.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("rate", [1e8, 1e30, MAX_RATE * 1.01])
def test_check_refuses_a_rate_no_load_generator_sends(
    tmp_path: Path, rate: float, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(_sla(tmp_path, rate))]) == 2
    err = capsys.readouterr().err
    assert "workload.arrival.rate: must be at most 100,000 req/s" in err
    assert "the load generator is one process" in err  # and why


def test_check_accepts_the_highest_rate(tmp_path: Path) -> None:
    assert main(["check", str(_sla(tmp_path, MAX_RATE))]) == 0


@pytest.mark.parametrize("phase", ["warm-up", "measured"])
def test_bench_at_the_highest_rate_stays_small_and_honours_sigterm(
    tmp_path: Path, phase: str
) -> None:
    python = write_engine_python(
        tmp_path / "engine" / "python", options=("--ttft-s", "0.5", "--itl-s", "0.05")
    )
    sla = _sla(tmp_path, MAX_RATE, python)
    env = {**os.environ, "AUTOTUNER_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotuner", "bench", str(sla), "--trials-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # The warm-up begins after the "load: poisson ..." line, the measured part with the
    # first progress line ("  load: N/100000 done").
    mark = "load: poisson" if phase == "warm-up" else "  load: "
    peak = [0]
    lines: list[str] = []

    def watch() -> None:
        me = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], me.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    children: list[psutil.Process] = []
    hang = threading.Timer(120, proc.kill)  # a bound against a hang only
    hang.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(mark):
                break
        else:
            raise AssertionError("bench ended before the phase:\n" + "".join(lines[-20:]))
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children  # the stand-in engine
        time.sleep(1.0)  # well into the phase
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - asked
        rest = proc.stderr.read()
    finally:
        hang.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    watcher.join(5)
    assert took < EXIT_WITHIN_S, f"exited {took:.1f} s after SIGTERM"
    assert code == 130, rest[-2000:]
    assert "interrupted; engine stopped" in rest
    assert peak[0] < RSS_LIMIT, f"peak RSS {peak[0] / 2**20:.0f} MB"
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    print(f"{phase}: exit {took:.2f} s after SIGTERM, peak RSS {peak[0] / 2**20:.0f} MB")
