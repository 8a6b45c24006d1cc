"""Whether the baseline (the engine's defaults with ``engine.params``) fits in memory, by the
engine's own memory model, as ``tune`` prunes every candidate by it.

The fixed options hold for every launch of a study, so a baseline they leave no KV cache for
fails at start-up and every candidate is pruned. The quick start did so on a host whose NUMA
node had 11.2 GiB of its 23.5 GiB: the CPU engine budgets a share of the node, not of the
host, and 0.05 of it was less than its worker's own memory. ``host.memory`` compared the share
with the host's RAM and passed.
"""

from __future__ import annotations

from typing import Any

from autotuner.core.errors import BadInput
from autotuner.core.hardware import GIB, HardwareProfile
from autotuner.engines.base import EngineAdapter
from autotuner.models import synth
from autotuner.models.folder import read_config
from autotuner.records.doctor import Finding
from autotuner.sla.spec import Sla
from autotuner.space import SearchSpace


def baseline_fit(
    sla: Sla, space: SearchSpace, adapter: EngineAdapter, hw: HardwareProfile
) -> Finding | None:
    """``engine.memory``: the memory model's verdict on the baseline; None when the model's
    config cannot be read here (``model`` findings say why elsewhere) or the engine has no
    model of its memory."""
    cfg = _model_config(sla)
    if cfg is None:
        return None
    params = {k: v for k, v in space.defaults.items() if v is not None} | dict(space.fixed)
    try:
        est = adapter.estimate_memory(cfg, params, hw, env=sla.engine.env, check_free=False)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None  # a config the model does not cover: no verdict rather than a wrong one
    where = f"{est.total_bytes / GIB:.1f} GiB the engine budgets from"
    if est.fits:
        return Finding(
            check="engine.memory",
            status="ok",
            found=f"the baseline fits: {est.kv_tokens} tokens of KV cache, of the {where}",
        )
    option = adapter.roles.memory_fraction or "its memory share"
    return Finding(
        check="engine.memory",
        status="fatal",
        found=f"the baseline (engine defaults and engine.params) will not start: {est.reason}",
        action=f"give the engine more memory in engine.params: a larger {option} (of the "
        f"{where}), or an explicit KV-cache size",
    )


def _model_config(sla: Sla) -> dict[str, Any] | None:
    try:
        if sla.model.synth:
            return synth.ARCHS[sla.model.synth].config()
        if sla.model.path is not None:
            return read_config(sla.resolve_path(sla.model.path))
    except (BadInput, KeyError, OSError, ValueError):
        return None
    return None
