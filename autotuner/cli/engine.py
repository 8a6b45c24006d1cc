"""`autotuner engine install|add|list|remove`: the registry of engine environments.

Exit 0 on success; 2 when the request is invalid (bad name or spec, unknown or conflicting
entry); 1 when the operation itself failed (no engine in that interpreter, pip failed, the
files could not be removed); 130 when interrupted.
"""

from __future__ import annotations

import json
import sys
import time

from autotuner.core.errors import Interrupted
from autotuner.engines.envs import (
    NO_ENV_HINT,
    EngineEnvError,
    EngineEnvUsageError,
    add,
    get,
    install,
    list_envs,
    remove,
)


def _fail(e: EngineEnvError) -> int:
    # Not BadInput's exit code: here only a usage error is bad input; a failed operation is 1.
    print(f"error: {e}", file=sys.stderr)
    return 2 if isinstance(e, EngineEnvUsageError) else 1


def main_install(spec: str, name: str | None) -> int:
    """``autotuner engine install SPEC [--name NAME]``."""
    t0 = time.monotonic()
    try:
        env = install(spec, name=name)
    except EngineEnvError as e:
        return _fail(e)
    except KeyboardInterrupt:
        raise Interrupted("interrupted; the partial install will be cleaned up next time") from None
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    mins, secs = divmod(int(time.monotonic() - t0), 60)
    print(f"ready: {env.name} ({mins}m{secs:02d}s)")
    return 0


def main_add(name: str, python: str, replace: bool) -> int:
    """``autotuner engine add NAME --python PATH [--replace]``."""
    try:
        env = add(name, python, replace=replace)
    except EngineEnvError as e:
        return _fail(e)
    print(
        f"registered {env.name}: {env.distribution} {env.version} ({env.device}), "
        f"python {env.python}"
    )
    return 0


def main_list(as_json: bool) -> int:
    """``autotuner engine list [--json]``: a table or a JSON array of the registry."""
    try:
        envs = list_envs()
    except EngineEnvError as e:
        return _fail(e)
    if as_json:
        print(json.dumps([e.to_dict() for e in envs], indent=2))
        return 0
    if not envs:
        print(f"no engine environments registered; {NO_ENV_HINT}")
        return 0
    header = ("NAME", "VERSION", "DIST", "DEVICE", "MANAGED", "PYTHON")
    rows = [header] + [
        (
            e.name,
            e.version,
            e.distribution,
            e.device,
            "yes" if e.managed else "no",
            str(e.python) + ("" if e.python.exists() else "  (missing)"),
        )
        for e in envs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    return 0


def main_remove(name: str) -> int:
    """``autotuner engine remove NAME``."""
    try:
        env = get(name)
        remove(name)
    except EngineEnvError as e:
        return _fail(e)
    except OSError as e:
        print(f"error: removing {name}: {e}", file=sys.stderr)
        return 1
    print(f"removed {name}" + (f" and deleted {env.python.parent.parent}" if env.managed else ""))
    return 0
