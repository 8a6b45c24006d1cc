"""A test-only engine package: the stand-in server (:mod:`autotuner.testing.standin`) as an
engine kind of its own, ``standin``.

It proves that an engine is one package: everything the tuner knows of this engine (flags,
launcher, log patterns, metric names, defaults, memory model, deploy renderer, its search
space ``standin.yaml``) lives in this folder, and nothing in ``autotuner/`` names it. It is
not under :mod:`autotuner.engines`, so the registry never imports it: tests register
:data:`ADAPTER` themselves (``tests/unit/engines/test_standin_engine.py``).
"""

from tests.unit.engines.standin_engine.adapter import ADAPTER, SPACE_DIR, StandinAdapter

__all__ = ["ADAPTER", "SPACE_DIR", "StandinAdapter"]
