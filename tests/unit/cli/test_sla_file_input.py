"""SLA files that are not what they claim (issue 40, low items): a FIFO, a device, a huge
file or a number of thousands of digits exit 2 with what is wrong, and never block, eat the
memory or crash (exit 70)."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from autotuner.cli.main import main
from autotuner.sla.bounds import MAX_SLA_BYTES

HEAD = "name: x\nmodel: {synth: tiny-llama}\n"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNER_HOME", str(tmp_path / "home"))


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    assert "internal error" not in out.err + out.out
    return out.err + out.out


@pytest.mark.parametrize("command", ["check", "doctor"])
def test_a_fifo_is_refused_not_waited_on(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "sla.yaml"
    os.mkfifo(fifo)
    # Should the read block (it did), a writer after 30 s lets the test fail instead of hang.
    rescue = threading.Timer(30, lambda: fifo.open("w").close())
    rescue.daemon = True
    rescue.start()
    try:
        assert main([command, str(fifo)]) == 2
    finally:
        rescue.cancel()
    assert f"{fifo}: is not a regular file (a FIFO, a device)" in _error(capsys)


def test_a_device_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zero = tmp_path / "zero"
    try:
        os.mknod(zero, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # like /dev/zero
    except PermissionError:
        pytest.skip("making a device node needs root")
    assert main(["check", str(zero)]) == 2
    assert f"{zero}: is not a regular file" in _error(capsys)


def test_a_file_over_the_cap_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(HEAD + "#" * MAX_SLA_BYTES + "\n")
    assert main(["check", str(big)]) == 2
    assert f"{big}: is over {MAX_SLA_BYTES} bytes, too large for an SLA file" in _error(capsys)


def test_an_integer_of_5000_digits_is_a_problem_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sla = tmp_path / "digits.yaml"
    sla.write_text(HEAD + "workload: {requests: " + "9" * 5000 + "}\n")
    assert main(["check", str(sla)]) == 2
    limit = sys.get_int_max_str_digits()
    assert f"{sla}: a value can't be read: an integer of more than {limit} digits" in _error(capsys)
