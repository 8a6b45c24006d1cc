"""A damaged or vanished daemon database: the daemon says so and exits 2 (which its systemd
unit does not restart), instead of a traceback and a restart loop, or a silent fresh start
that forgets every SLA and promotion still on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.daemon.config import DaemonConfig
from autotuner.daemon.errors import StoreDamaged
from autotuner.daemon.service import Daemon
from autotuner.daemon.store import Store


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _filled(root: Path, slas: int = 60) -> Path:
    """A state directory whose database records ``slas`` SLAs (several pages of them)."""
    db = root / "daemon.db"
    store = Store(db)
    for i in range(slas):
        store.add_sla(f"sla-{i}", "name: x\n" + "# padding\n" * 50, "0 2 * * *", "eng-a")
        store.enqueue("tune", f"sla-{i}", "eng-a")
    store.close()
    (root / "slas" / "sla-0").mkdir(parents=True)
    (root / "slas" / "sla-0" / "source.yaml").write_text("name: sla-0\n")
    return db


def test_a_truncated_daemon_database_exits_2_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "state"
    db = _filled(root)
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    argv = ["daemon", "--state-dir", str(root), "--port", "0"]
    for _ in range(2):  # again: the failed start freed the state directory's lock
        assert main(argv) == StoreDamaged.exit_code == 2
        err = capsys.readouterr().err
        assert err.startswith(
            f"error: the daemon database {db} is damaged (database disk image is malformed); "
            "restore it from a backup, or move the state directory"
        ), err
        assert "Traceback" not in err


def test_a_file_that_is_not_a_database_is_damaged_too(tmp_path: Path) -> None:
    db = tmp_path / "daemon.db"
    db.write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(StoreDamaged, match=r"is damaged \(file is not a database\)"):
        Store(db)


@pytest.mark.parametrize("how", ["empty", "missing"])
def test_an_empty_or_missing_database_beside_recorded_slas_is_refused(
    tmp_path: Path, how: str
) -> None:
    root = tmp_path / "state"
    db = _filled(root)
    bundle = root / "studies" / "sla-0" / "eng-a" / "sla-0" / "promoted"
    bundle.mkdir(parents=True)
    (bundle / "optimization_manifest.json").write_text("{}")
    (root / "spool" / "done").mkdir(parents=True)
    (root / "spool" / "done" / "a.yaml").write_text("name: a\n")
    if how == "empty":
        db.write_bytes(b"")
    else:
        db.unlink()
    shown = "empty (0 bytes)" if how == "empty" else "missing"
    with pytest.raises(StoreDamaged) as err:
        Daemon(DaemonConfig(state_dir=root))
    assert str(err.value) == (
        f"the daemon database {db} is {shown}, but {root} holds what it recorded: "
        "1 SLAs (slas/), 1 promoted bundles (studies/), 1 submitted spool files (spool/done/); "
        "starting on an empty database would forget them. Restore daemon.db from a backup, "
        "or move the state directory aside to start afresh"
    )
    assert not db.exists() or db.stat().st_size == 0  # nothing was written to it


def test_a_first_start_and_a_restart_open_as_before(tmp_path: Path) -> None:
    root = tmp_path / "state"
    Daemon(DaemonConfig(state_dir=root)).close()  # a first start: no database, no traces
    (root / "slas" / "p").mkdir(parents=True)
    (root / "slas" / "p" / "source.yaml").write_text("name: p\n")
    d = Daemon(DaemonConfig(state_dir=root))  # a restart on a good database
    d.close()
