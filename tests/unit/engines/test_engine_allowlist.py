"""What an SLA may hand the engine: allow-listed options, command-line words and variables.

Before, `engine.env` went to the engine unchecked (a PYTHONWARNINGS + BROWSER pair ran a
command as the daemon user; CUDA_VISIBLE_DEVICES overrode the leased GPU) and `engine.args`
carried `--host 0.0.0.0` past `check` to a traceback at launch. Now `check` refuses them with
file:line (exit 2), the daemon with 400, and the launcher sets what it owns last.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from autotuner.cli.main import main
from autotuner.daemon.api import make_app
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.engines import envs, registry
from autotuner.engines.vllm.flags import check_extra_args
from autotuner.engines.vllm.launcher import VllmEngine
from autotuner.sla.spec import SlaError, parse_sla

BASE = """\
model: {synth: tiny-llama}
target: cpu
workload:
  input_tokens: 16
  output_tokens: 8
  arrival: {process: poisson, rate: 1}
  requests: 10
engine:
"""


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str) -> tuple[int, str]:
    path = tmp_path / "sla.yaml"
    path.write_text(BASE + engine)
    code = main(["check", str(path)])
    return code, capsys.readouterr().err.replace(str(path), "sla.yaml")


# --------------------------------------------------------------------------- engine.env


def test_code_running_variables_are_refused_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _check(
        tmp_path,
        capsys,
        "  env:\n    PYTHONWARNINGS: 'ignore::antigravity.Foo'\n    BROWSER: 'touch /tmp/pwned'\n",
    )
    assert code == 2
    assert "sla.yaml:10: engine.env.PYTHONWARNINGS: an SLA may not set this variable" in err
    assert "sla.yaml:11: engine.env.BROWSER: an SLA may not set this variable" in err
    assert "run other code" in err


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("CUDA_VISIBLE_DEVICES", "set by the autotuner from the devices leased"),
        ("HIP_VISIBLE_DEVICES", "set by the autotuner from the devices leased"),
        ("HF_HUB_OFFLINE", "engines never download"),
        ("VLLM_PLUGINS", "names code, files, hosts or secrets"),
        ("VLLM_LOGGING_CONFIG_PATH", "names code, files, hosts or secrets"),
        ("VLLM_ALLOW_INSECURE_SERIALIZATION", "names code, files, hosts or secrets"),
        ("LD_PRELOAD", "run other code"),
        ("SOME_VARIABLE", "not on the list of harmless variables"),
    ],
)
def test_reserved_and_unlisted_variables_are_refused(name: str, line: str) -> None:
    with pytest.raises(SlaError) as info:
        parse_sla(BASE + f"  env: {{{name}: '1'}}\n", "s.yaml")
    assert f"s.yaml:9: engine.env.{name}: " in str(info.value)
    assert line in str(info.value)


def test_listed_variables_pass_and_their_values_are_checked() -> None:
    sla = parse_sla(
        BASE + "  env: {OMP_NUM_THREADS: 4, VLLM_CPU_KVCACHE_SPACE: '8',"
        " VLLM_USE_FLASHINFER_SAMPLER: '0', TOKENIZERS_PARALLELISM: 'false'}\n"
    )
    assert sla.engine.env["OMP_NUM_THREADS"] == "4"
    with pytest.raises(SlaError, match=r"VLLM_CPU_KVCACHE_SPACE: must be a whole number"):
        parse_sla(BASE + "  env: {VLLM_CPU_KVCACHE_SPACE: '/etc/passwd'}\n")


def test_every_listed_variable_is_a_safe_shape() -> None:
    """No listed variable takes a path or spaces: a value cannot name a file or a command."""
    for adapter in registry.adapters():
        assert not set(adapter.env_vars) & set(adapter.reserved_env)
        for name, rule in adapter.env_vars.items():
            assert rule.problem("/tmp/x") is not None, name
            assert rule.problem("a b") is not None, name


# --------------------------------------------------------------------------- engine.args


@pytest.mark.parametrize(
    ("args", "where", "phrase"),
    [
        ("[--host, 0.0.0.0]", "engine.args[0]", "engines bind to 127.0.0.1"),
        ("['--host=0.0.0.0']", "engine.args[0]", "engines bind to 127.0.0.1"),
        ("[--port, '80']", "engine.args[0]", "it picks a free port"),
        ("[--model, /etc]", "engine.args[0]", "from the 'model' section"),
        ("[--served_model_name, x]", "engine.args[0]", "use model.served_name"),
        ("[--hos, 0.0.0.0]", "engine.args[0]", "abbreviates --host"),
        ("[0.0.0.0]", "engine.args[0]", "'0.0.0.0' follows no option"),
        ("[--config, f.yaml]", "engine.args[0]", "not an option an SLA may set"),
        ("[--trust-remote-code]", "engine.args[0]", "not an option an SLA may set"),
        ("[--middleware, os.system]", "engine.args[0]", "not an option an SLA may set"),
        ("[--max-num-seqs, fast]", "engine.args[1]", "must be an integer"),
        ("[--max-num-seqs=-4]", "engine.args[0]", "must be an integer in [1,"),
        ("[--enforce-eager=yes]", "engine.args[0]", "a switch takes no value"),
        ("[-O3]", "engine.args[0]", "long form"),
    ],
)
def test_args_are_allow_listed_in_any_spelling(args: str, where: str, phrase: str) -> None:
    with pytest.raises(SlaError) as info:
        parse_sla(BASE + f"  args: {args}\n", "s.yaml")
    assert f"s.yaml:9: {where}: " in str(info.value), info.value
    assert phrase in str(info.value)


def test_known_options_pass_as_args() -> None:
    words = ["--max-num-seqs", "8", "--seed=3", "--enforce-eager", "--no-enable-prefix-caching"]
    sla = parse_sla(BASE + f"  args: {words}\n")
    assert sla.engine.args == words


@pytest.mark.parametrize("word", ["--served_model_name=x", "--hos", "--po=1", "--config"])
def test_the_launcher_refuses_rebinding_in_any_spelling(word: str) -> None:
    with pytest.raises(ValueError, match=r"set by the tuner|reads flags from a file"):
        check_extra_args([word])
    check_extra_args(["--seed", "1", "--max_num_seqs", "8"])


def test_check_exits_2_on_a_rebinding_arg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _check(tmp_path, capsys, "  args: ['--host', '0.0.0.0']\n")
    assert code == 2
    assert "sla.yaml:9: engine.args[0]: cannot be set here" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- the launcher


def _engine(env: dict[str, str], cuda: list[str] | None) -> VllmEngine:
    return VllmEngine(
        python=Path("/venv/bin/python"),
        model=Path("/models/tiny"),
        served_name="tiny",
        params={},
        extra_args=[],
        env=env,
        cuda_devices=cuda,
        log_path=Path("/tmp/x.log"),
    )


def test_the_lease_and_offline_variables_are_set_last() -> None:
    """Even an env that got past the SLA check cannot override what the launcher owns."""
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HIP_VISIBLE_DEVICES": "0",
        "AUTOTUNER_VLLM_PYTHON": "/x",
        "OMP_NUM_THREADS": "3",
    }
    child = _engine(env, ["GPU-leased"]).child_env()
    assert child["CUDA_VISIBLE_DEVICES"] == "GPU-leased"
    assert child["HF_HUB_OFFLINE"] == child["TRANSFORMERS_OFFLINE"] == "1"
    assert child.get("HIP_VISIBLE_DEVICES") != "0"
    assert "AUTOTUNER_VLLM_PYTHON" not in child
    assert child["OMP_NUM_THREADS"] == "3"
    assert _engine(env, None).child_env()["CUDA_VISIBLE_DEVICES"] == ""


# --------------------------------------------------------------------------- over HTTP


def test_the_daemon_refuses_the_same_with_400(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envs, "list_envs", lambda: [])
    daemon = Daemon(DaemonConfig(state_dir=tmp_path / "state"))
    text = BASE + "  env: {BROWSER: 'touch /tmp/pwned', CUDA_VISIBLE_DEVICES: '3'}\n"
    text += "  args: ['--host=0.0.0.0']\n"

    async def go() -> None:
        client = TestClient(TestServer(make_app(daemon)))
        await client.start_server()
        try:
            r = await client.post(
                "/v1/studies?source=evil.yaml",
                data=text,
                headers={"Authorization": f"Bearer {daemon.token}"},
            )
            assert r.status == 400
            errors = (await r.json())["errors"]
        finally:
            await client.close()
        assert any(e.startswith("evil.yaml:9: engine.env.BROWSER: ") for e in errors), errors
        assert any("evil.yaml:9: engine.env.CUDA_VISIBLE_DEVICES: " in e for e in errors)
        assert any("evil.yaml:10: engine.args[0]: cannot be set here" in e for e in errors)

    try:
        asyncio.run(go())
    finally:
        daemon.close()
