"""The stand-in server as an engine process (a :class:`ServerProcess`).

It runs in the interpreter the launch names, as ``python -m`` :data:`SERVER_MODULE` (this
package's entry point, which runs :mod:`autotuner.testing.standin`); the repository root is
put on the child's ``PYTHONPATH`` so that both packages import there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotuner.core.types import ParamValue
from autotuner.engines.base import LaunchCause
from autotuner.engines.process import ServerProcess
from tests.unit.engines.standin_engine import flags, logs

SERVER_MODULE = "tests.unit.engines.standin_engine.serve"
# Forces the engine interpreter (engines/envs.py); the engine itself must not see it.
PYTHON_VAR = "AUTOTUNER_STANDIN_PYTHON"
# Where `tests` and `autotuner` import from in the child.
ROOT = Path(__file__).resolve().parents[4]
# Every log line reaches the log file when written.
LAUNCH_ENV: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
# What the engine process sets itself, last.
RESERVED_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "set by the autotuner from the devices leased for the run",
    "PYTHONPATH": "set by the autotuner so that the stand-in imports",
}


def engine_env(sla_env: Mapping[str, str]) -> dict[str, str]:
    """The variables the stand-in runs with beyond what it inherits: the SLA's
    ``engine.env`` (but the reserved ones), then :data:`LAUNCH_ENV`."""
    own = {k: v for k, v in sla_env.items() if k not in RESERVED_ENV}
    return {**own, **LAUNCH_ENV}


class StandinEngine(ServerProcess):
    """One stand-in server for one config (an :class:`EngineProcess`)."""

    kind = "standin"

    def __init__(
        self,
        *,
        python: Path,
        model: Path,
        served_name: str,
        params: Mapping[str, ParamValue],
        extra_args: list[str],
        env: Mapping[str, str],
        cuda_devices: list[str] | None,
        log_path: Path,
        startup_timeout_s: float = 60.0,
        cpus: Sequence[int] | None = None,
    ) -> None:
        flags.check_extra_args(extra_args)
        super().__init__(
            served_name=served_name,
            cuda_devices=cuda_devices,
            log_path=log_path,
            startup_timeout_s=startup_timeout_s,
            cpus=cpus,
        )
        self.python = python
        self.model = model
        self.params = dict(params)
        self.extra_args = list(extra_args)
        self.env = dict(env)

    def argv(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            SERVER_MODULE,
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *flags.params_to_args(self.params),
            *self.extra_args,
        ]

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(engine_env(self.env))
        env.pop(PYTHON_VAR, None)
        inherited = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([inherited] if inherited else [])])
        env["CUDA_VISIBLE_DEVICES"] = ",".join(self.cuda_devices or [])
        return env

    def classify_failure(self, log_tail: str) -> LaunchCause:
        return logs.classify_failure(log_tail)

    def root_cause(self, log: str) -> list[str]:
        return logs.root_cause(log)
