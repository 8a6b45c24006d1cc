"""Fixtures every unit test gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.daemon.hostlocks import LEASE_DIR_VAR


@pytest.fixture(autouse=True)
def _private_lease_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Daemons built in tests lease devices in a folder of their own, not the host-wide one:
    test runs side by side (and a real daemon on the host) must not wait for each other."""
    path = tmp_path_factory.mktemp("leases")
    monkeypatch.setenv(LEASE_DIR_VAR, str(path))
    return path
