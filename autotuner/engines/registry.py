"""Engine adapters by kind: ``get("<kind>")`` is how the tuner finds the engine an SLA names.

Each engine is a subpackage of :mod:`autotuner.engines` that calls :func:`register` with its
adapter when imported; the first lookup imports every such subpackage, so adding an engine is
adding its folder (and its ``search_spaces`` file). One adapter registers as the default: the
engine an SLA gets when it names none.
"""

from __future__ import annotations

import importlib
import pkgutil

from autotuner.core.errors import BadInput
from autotuner.engines.base import EngineAdapter

_ADAPTERS: dict[str, EngineAdapter] = {}
_default: str | None = None
_loaded = False


def register(adapter: EngineAdapter, *, default: bool = False) -> None:
    """Make ``adapter`` available under ``adapter.kind`` (again: replaced)."""
    global _default
    if default and _default not in (None, adapter.kind):
        raise ValueError(f"engine kinds {_default!r} and {adapter.kind!r} both claim the default")
    _ADAPTERS[adapter.kind] = adapter
    if default:
        _default = adapter.kind


def _load_builtins() -> None:
    """Import every engine subpackage once; their imports call :func:`register`."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = importlib.import_module("autotuner.engines")
    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg:
            importlib.import_module(f"{package.__name__}.{module.name}")


def kinds() -> tuple[str, ...]:
    """The registered engine kinds, sorted."""
    _load_builtins()
    return tuple(sorted(_ADAPTERS))


def adapters() -> tuple[EngineAdapter, ...]:
    """Every registered adapter, in :func:`kinds` order."""
    return tuple(_ADAPTERS[k] for k in kinds())


def get(kind: str) -> EngineAdapter:
    """The adapter of engine ``kind``; :class:`BadInput` naming the known kinds if none."""
    _load_builtins()
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        known = ", ".join(sorted(_ADAPTERS)) or "none"
        raise BadInput(f"unknown engine kind {kind!r} (known: {known})")
    return adapter


def default_kind() -> str:
    """The kind an SLA without ``engine.kind`` gets."""
    _load_builtins()
    if _default is None:
        raise BadInput("no engine adapter registered as the default")
    return _default


def default() -> EngineAdapter:
    """The default kind's adapter."""
    return get(default_kind())
