"""Test helpers shipped with the package: an OpenAI-compatible stand-in for vLLM.

Only for fast unit tests of the load generator and the daemon plumbing; real evidence
always comes from a real engine. See :mod:`autotuner.testing.standin`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotuner.testing.standin import StandinConfig, StandinServer, StandinStats

__all__ = ["StandinConfig", "StandinServer", "StandinStats"]


def __getattr__(name: str) -> Any:
    # Lazy re-export: importing standin eagerly here would make
    # `python -m autotuner.testing.standin` warn that the module was already imported.
    if name in __all__:
        from autotuner.testing import standin

        return getattr(standin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
