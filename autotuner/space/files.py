"""Where space files are, which one covers an engine version, and reading one (parsed and
checked, problems with file and line)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from autotuner.core.options import OptionRule
from autotuner.core.yamlpos import KeyPath, load_located
from autotuner.space.check import _check_file, _check_strategy, _option_rule
from autotuner.space.errors import SpaceError
from autotuner.space.schema import _File
from autotuner.space.versions import version_in


def spaces_dir() -> Path:
    """The ``search_spaces`` folder: the repository's (a checkout or an editable install), else
    the copy a wheel carries inside the package."""
    package = Path(__file__).resolve().parent.parent
    repo = package.parent / "search_spaces"
    if repo.is_dir():
        return repo
    return package / "search_spaces"


def read_space_file(path: Path) -> _File:
    """Parse and check one space file; problems name the file and line (``file:12: ...``)."""
    try:
        located = load_located(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SpaceError([f"{path}: {e}"]) from e

    def at(key: KeyPath) -> str:
        line = located.line_of(key)
        return f"{path}:{line}" if line is not None else str(path)

    try:
        spec = _File.model_validate(located.data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            problems.append(f"{at(tuple(err['loc']))}: {loc}: {err['msg']}")
        raise SpaceError(problems) from e
    index = {d.name: ("params", i) for i, d in enumerate(spec.params)}
    problems = []
    for p in _check_file(spec):
        name = p.split(":", 1)[0].split(".")[1] if p.startswith("params.") else ""
        problems.append(f"{at(index.get(name, ()))}: {p}")
    problems += [f"{at(key)}: {p}" for key, p in _check_strategy(spec)]
    if problems:
        raise SpaceError(problems)
    return spec


@dataclass(frozen=True)
class DeclaredOptions:
    """The options one space file declares, as rules for the values an SLA may give them.

    ``file`` is where they come from, ``versions`` the releases it covers.
    """

    file: Path
    versions: str
    rules: dict[str, OptionRule]


def newest_declarations(engine: str, *, directory: Path | None = None) -> DeclaredOptions:
    """The declarations of ``engine``'s space for its newest releases: the file whose
    ``versions`` has no upper end (else the last by name).

    For checks made before the engine's version is known (``autotuner check``, a submission):
    types, limits and choices; whether the version in use has an option is decided by
    :func:`load_space` when tuning.
    """
    base = directory or spaces_dir()
    files = sorted({*base.glob(f"{engine}.yaml"), *base.glob(f"{engine}-*.yaml")})
    if not files:
        raise SpaceError([f"no search space for engine {engine!r} in {base}"])
    stamps = tuple((f, f.stat().st_mtime_ns) for f in files)
    return _newest(engine, stamps)


@functools.lru_cache(maxsize=8)
def _newest(engine: str, stamps: tuple[tuple[Path, int], ...]) -> DeclaredOptions:
    specs = [(f, read_space_file(f)) for f, _ in stamps]
    open_ended = [(f, s) for f, s in specs if version_in((1_000_000,), s.versions)]
    file, spec = open_ended[-1] if open_ended else specs[-1]
    where = f"{file.parent.name}/{file.name}"
    rules = {d.name: _option_rule(d, where) for d in spec.params}
    return DeclaredOptions(file, spec.versions, rules)


def space_file(engine: str, version: str, *, directory: Path | None = None) -> Path:
    """The ``<engine>.yaml`` / ``<engine>-*.yaml`` file whose ``versions`` covers ``version``."""
    base = directory or spaces_dir()
    files = sorted({*base.glob(f"{engine}.yaml"), *base.glob(f"{engine}-*.yaml")})
    if not files:
        raise SpaceError([f"no search space for engine {engine!r} in {base}"])
    matching = [f for f in files if version_in(version, read_space_file(f).versions)]
    if len(matching) != 1:
        found = ", ".join(f"{f.name} ({read_space_file(f).versions or 'any'})" for f in files)
        what = "no search space covers" if not matching else "several search spaces cover"
        raise SpaceError([f"{what} {engine} {version}: {found}"])
    return matching[0]
