"""Engine watching: re-probe the registered engine environments and react to a new one (a
regression check of every promoted config) or a version changed in place (a re-check)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from autotuner.engines import envs

if TYPE_CHECKING:
    from autotuner.daemon.service import Daemon

logger = logging.getLogger(__name__)


def probe_engines() -> list[envs.EngineEnv | str]:
    """Re-probe every registered engine (starts interpreters: call it off the loop).
    Entries that fail to probe come back as their name."""
    out: list[envs.EngineEnv | str] = []
    for env in envs.list_envs():
        try:
            out.append(envs.refresh(env.name)[0])
        except envs.EngineEnvError:
            out.append(env.name)
    return out


def scan_engines(
    d: Daemon, probed: list[envs.EngineEnv | str] | None = None
) -> list[tuple[str, str | None, str]]:
    """React to new engines and changed versions among ``probed`` (default: probe now).

    Returns (name, previous version or None for a new engine, version) per change.
    The very first scan of a fresh daemon only records what is there.
    """
    if probed is None:
        probed = probe_engines()
    seen = d.store.engines()
    first = not seen  # a fresh state directory: what is there now is the starting point
    changes: list[tuple[str, str | None, str]] = []
    present = set()
    for env in probed:
        if isinstance(env, str):
            present.add(env)
            logger.warning("engine %s: cannot probe its interpreter; skipped", env)
            continue
        present.add(env.name)
        before = seen.get(env.name)
        d.store.see_engine(env.name, env.version, env.distribution, env.device)
        if before is None:
            changes.append((env.name, None, env.version))
        elif before["version"] != env.version:
            changes.append((env.name, str(before["version"]), env.version))
    for name in set(seen) - present:
        d.store.forget_engine(name)
    if first:
        return []
    for name, old_version, version in changes:
        engine_changed(d, name, old_version, version)
    return changes


def engine_changed(d: Daemon, name: str, old_version: str | None, version: str) -> None:
    new_env = envs.get(name)
    what = "registered" if old_version is None else f"changed from {old_version}"
    logger.info("engine %s %s (%s)", name, what, version)
    for row in d.store.slas():
        p = row.promotion
        if not p:
            continue
        current = p.engine or row.engine
        try:
            cur_env = envs.get(current)
        except envs.EngineEnvError:
            cur_env = None
        if current == name:
            # Upgraded in place: the old version is gone, so compare with what the
            # promotion measured (the nightly re-check path), then re-tune.
            d.alert(
                "engine_changed",
                row.name,
                "info",
                f"{row.name}: engine {name} changed from {old_version} to {version} in "
                "place; re-checking the promoted config against its recorded goodput",
                {"engine": name, "old_version": old_version, "new_version": version},
            )
            if not d.store.pending(row.name, "recheck"):
                d.enqueue_recheck(row.name, name, priority=1)
            continue
        if cur_env is None or cur_env.device != new_env.device or cur_env.kind != new_env.kind:
            continue
        if any(
            j.kind == "regression" and j.args.get("new") == name
            for j in d.store.jobs(states=("queued", "running"), sla=row.name)
        ):
            continue
        d.enqueue_regression(row.name, current, name, priority=1)
    d.wake.set()
