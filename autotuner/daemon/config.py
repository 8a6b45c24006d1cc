"""The daemon's configuration file (YAML), validated like SLA files: unknown keys are errors."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from croniter import CroniterBadDateError, CroniterError, croniter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotuner.core import paths
from autotuner.core.errors import BadInput

DEFAULT_PORT = 8787
# The largest SLA the daemon takes, by any road: an HTTP body (413 beyond it), a spool file
# (refused unread) and the text kept in daemon.db. ``max_request_bytes`` sets it.
MAX_SLA_BYTES = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MAX_CRON_CHARS = 200  # a longer expression is no schedule anyone means


def check_cron(value: str) -> str:
    """A five-field cron expression (minute hour day month weekday), local time, that fires.

    An expression naming a date no month has (``0 0 30 2 *``) parses, but no re-check would
    ever run and every attempt to plan one fails: it is refused here, where it comes in."""
    if len(value) > MAX_CRON_CHARS or len(value.split()) != 5 or not croniter.is_valid(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise ValueError(f"not a 5-field cron expression: {shown!r} (e.g. '0 2 * * *')")
    next_run(value, time.time())  # ValueError when it never fires
    return value


def next_run(cron: str, after: float) -> float:
    """The next time (Unix seconds) ``cron`` fires after ``after``, in local time; ValueError
    when it never does or is no cron expression."""
    try:
        start = datetime.fromtimestamp(after).astimezone()
        return float(croniter(cron, start).get_next(float))
    except CroniterBadDateError:
        raise ValueError(
            f"{cron!r} never fires: no date matches it (a day the month never has, such as "
            "30 February?)"
        ) from None
    except (CroniterError, OverflowError) as exc:
        raise ValueError(f"{cron!r}: {exc}") from None


class Webhook(_Strict):
    url: str
    timeout_s: float = Field(default=10.0, gt=0)
    # retried with backoff 2, 4, 8, ... s (capped at 10 min)
    max_attempts: int = Field(default=8, ge=1)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("webhook url must start with http:// or https://")
        return v


class RegressionSettings(_Strict):
    replicates: int = Field(default=3, ge=1, le=20)  # launches per engine, interleaved
    min_effect: float = Field(default=0.05, ge=0, lt=1)  # smallest change worth an alarm
    retune: bool = True  # re-tune on the new engine after the check


class DaemonConfig(_Strict):
    state_dir: Path = Field(default_factory=lambda: paths.home() / "daemon")
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    external_url: str | None = None  # how alert receivers reach the API (default: the bind)
    schedule: str = "0 2 * * *"  # nightly re-check of every SLA; per SLA overridable at submit
    spool_poll_s: float = Field(default=2.0, gt=0)
    engine_poll_s: float = Field(default=300.0, gt=0)  # how often engines are re-probed
    max_request_bytes: int = Field(default=MAX_SLA_BYTES, ge=1024)
    # Where model.path and workload.dataset of SLAs that come in over HTTP or the spool may
    # point (absolute directories; STATE_DIR/spool/ always counts). The local CLI is not
    # confined: it runs as its user anyway.
    allowed_paths: list[Path] = Field(default_factory=list)
    # Host-wide device leases: one lock file per device, shared by every daemon on the host
    # (default: $AUTOTUNER_LEASE_DIR, else /run/lock/autotuner, else $XDG_RUNTIME_DIR).
    lease_dir: Path | None = None
    retune_trials: int = Field(default=0, ge=0)  # launches a re-tune adds (0: tune.trials)
    max_attempts: int = Field(default=3, ge=1)  # a job that crashes is retried this often
    exclude_gpus: list[str] = Field(default_factory=list)  # indices or UUIDs never leased
    gpu_free_timeout_s: float = Field(default=120.0, gt=0)  # for NVML to show a GPU freed
    gpu_idle_mib: int = Field(default=1024, ge=0)  # "free" = at most this much used by anyone
    webhooks: list[Webhook] = Field(default_factory=list)
    # Where tune jobs run their trials: "local" (here, under the daemon's device leases) or
    # "ray" (Ray tasks on the cluster at ray_address, or a local Ray: Ray places each trial).
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    regression: RegressionSettings = Field(default_factory=RegressionSettings)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        return check_cron(v)

    @field_validator("state_dir")
    @classmethod
    def _abs(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("allowed_paths")
    @classmethod
    def _abs_roots(cls, v: list[Path]) -> list[Path]:
        for p in v:
            if not p.expanduser().is_absolute():
                raise ValueError(f"must be absolute directories, got {str(p)!r}")
        return [p.expanduser().resolve() for p in v]

    @field_validator("lease_dir")
    @classmethod
    def _abs_lease_dir(cls, v: Path | None) -> Path | None:
        return None if v is None else v.expanduser().resolve()


class ConfigError(BadInput):
    pass


def load_config(path: str | Path | None, **overrides: Any) -> DaemonConfig:
    """Read the YAML file (if any) and apply command-line overrides (``None`` means unset)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = loaded or {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as exc:
        lines = [
            f"{path or 'config'}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ConfigError("\n".join(lines)) from None
