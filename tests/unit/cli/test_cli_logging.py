"""Library log records reach the terminal through the CLI: warnings always, debug with --debug."""

from __future__ import annotations

import logging

import pytest

from autotuner.cli import main as cli


def _command_that_logs() -> int:
    log = logging.getLogger("autotuner.search.study")
    log.debug("a debug detail")
    log.warning("a warning the user must see")
    return 0


@pytest.mark.parametrize("debug", [False, True])
def test_library_logs_reach_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], debug: bool
) -> None:
    monkeypatch.setattr(cli, "_dispatch", lambda args: _command_that_logs())
    argv = ["report", "nothing"] + (["--debug"] if debug else [])
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "WARNING autotuner.search.study: a warning the user must see" in err
    assert ("a debug detail" in err) is debug


def test_one_handler_however_often_main_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_dispatch", lambda args: 0)
    for _ in range(3):
        cli.main(["report", "nothing"])
    handlers = logging.getLogger("autotuner").handlers
    handlers = [h for h in handlers if type(h).__module__ == cli.__name__]
    assert len(handlers) == 1
