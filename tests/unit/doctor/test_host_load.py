"""The host is part of the measurement (issue 28): `doctor` and `tune` warn when other
processes use the cores; a sample of this host is well-formed."""

from __future__ import annotations

from autotuner.doctor.host import load_finding
from autotuner.measure.hostload import BUSY_SHARE, HostSample, busy_warning, sample

BUSY = HostSample(load1=3.0, others_share=0.65, cores=2)
QUIET = HostSample(load1=0.2, others_share=0.01, cores=2)


def test_doctor_warns_on_a_busy_host_and_passes_a_quiet_one() -> None:
    busy = load_finding("cpu", BUSY)
    assert busy.status == "warning" and busy.check == "host.load"
    assert "other processes used 1.3 of 2 cores (65%), load average 3.00" in busy.found
    assert busy.action is not None and "the CPU engine's latency" in busy.action
    assert load_finding("cuda", BUSY).action is not None
    assert "load generator" in (load_finding("cuda", BUSY).action or "")
    assert load_finding("cpu", QUIET).status == "ok"


def test_tune_warns_on_a_busy_host_only() -> None:
    said = busy_warning("cpu", BUSY)
    assert said is not None and "report` marks those measured on a busy host" in said
    assert busy_warning("cpu", QUIET) is None


def test_a_sample_of_this_host() -> None:
    now = sample(0.2)
    assert now.cores >= 1 and now.load1 >= 0 and now.others_share >= 0
    assert now.busy == (now.others_share > BUSY_SHARE)
