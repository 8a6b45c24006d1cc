"""deploy/: the files parse, agree with each other, and use only what the daemon exports."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from autotuner.daemon.config import (
    DEFAULT_PORT,
    DaemonConfig,
    RegressionSettings,
    Webhook,
    load_config,
)
from autotuner.daemon.metrics import METRIC_NAMES, StoreCollector, make_registry, render
from autotuner.daemon.service import STOP_GRACE_S
from autotuner.daemon.store import Store

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "autotuner-dashboard.json"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
ENTRYPOINT = DEPLOY / "docker-entrypoint.sh"
UNIT = DEPLOY / "systemd" / "autotuner.service"
EXAMPLE = DEPLOY / "daemon.example.yaml"
STATE_DIR = Path("/var/lib/autotuner/daemon")

# Labels Prometheus adds to every scraped series; the daemon never exports them.
TARGET_LABELS = {"instance", "job"}
SEVERITIES = {"critical", "warning", "info"}

_METRIC = re.compile(r"\bautotuner_[a-z0-9_]+")
_SELECTOR = re.compile(r"\b(autotuner_[a-z0-9_]+)\s*(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
_TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _yaml(ALERTS)["groups"] for rule in group["rules"]]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _dashboard_exprs() -> list[tuple[str, str]]:
    """(expr, legend) of every panel target and every variable query."""
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = [
        (t["expr"], t.get("legendFormat", ""))
        for p in _panels(dash["panels"])
        for t in p.get("targets", [])
    ]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            out.append((var["definition"], ""))
    return out


def _compose() -> dict[str, Any]:
    """compose.yaml with ``${VAR:-default}`` replaced by its default, as with no .env."""
    text = COMPOSE.read_text(encoding="utf-8")
    text = re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", text)
    data = yaml.safe_load(re.sub(r"\$\{\w+\}", "", text))
    assert isinstance(data, dict)
    return data


def _unit() -> dict[str, list[str]]:
    """Key -> values (keys may repeat) of the systemd unit, sections merged."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _seconds(text: str) -> float:
    """A duration as systemd and compose write it: 120, 120s, 2m, 2m30s."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text.replace(" ", ""), text
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)


# --------------------------------------------------------------------------- all files


def test_every_yaml_file_parses() -> None:
    files = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])
    assert len(files) >= 6
    for f in files:
        assert isinstance(_yaml(f), dict), f


# --------------------------------------------------------------------------- alert rules


def test_alert_rules_have_severity_summary_and_description() -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        assert rule["expr"].strip(), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smhd]", rule["for"]), rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        assert rule["expr"].count("{") == rule["expr"].count("}"), rule["alert"]


@pytest.mark.parametrize(
    "fragment",
    [
        'up{job="autotuner"} == 0',
        'autotuner_regression_verdict{verdict="regression"} == 1',
        "autotuner_sla_feasible == 0",
        'autotuner_jobs{state="failed"}',
        "autotuner_queue_length > 0",
        "autotuner_alerts_undelivered > 0",
        "time() - autotuner_last_promotion_timestamp_seconds > 2 * 86400",
    ],
)
def test_alert_rules_cover(fragment: str) -> None:
    assert any(fragment in " ".join(r["expr"].split()) for r in _rules())


def test_alert_rules_use_only_exported_metrics() -> None:
    used = set(_METRIC.findall(ALERTS.read_text(encoding="utf-8")))
    assert used, "no autotuner_* metric in the rules"
    assert used <= set(METRIC_NAMES), sorted(used - set(METRIC_NAMES))


def test_daemon_down_rule_selects_the_scrape_job() -> None:
    jobs = {c["job_name"] for c in _yaml(PROMETHEUS)["scrape_configs"]}
    selected = set()
    for rule in _rules():
        selected |= set(re.findall(r'\bup\{job="([^"]+)"\}', rule["expr"]))
    assert selected, "no rule watches up{job=...}"
    assert selected <= jobs


# --------------------------------------------------------------------------- prometheus.yml


def test_prometheus_scrapes_with_the_token_and_loads_the_rules() -> None:
    cfg = _yaml(PROMETHEUS)
    rule_files = [PROMETHEUS.parent / f for f in cfg["rule_files"]]
    assert ALERTS in rule_files
    (scrape,) = [c for c in cfg["scrape_configs"] if c["job_name"] == "autotuner"]
    auth = scrape["authorization"]
    assert auth["type"] == "Bearer"
    assert auth["credentials_file"].startswith("/")
    assert "credentials" not in auth  # never the token itself
    assert scrape.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in scrape["static_configs"] for t in sc["targets"]]
    assert any(t.endswith(f":{DEFAULT_PORT}") for t in targets)


def _mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of a compose service's short-syntax volumes."""
    out = []
    for v in service.get("volumes", []):
        parts = v.split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def test_compose_prometheus_mounts_its_config_rules_and_token_read_only() -> None:
    services = _compose()["services"]
    prom = services["prometheus"]
    mounts = _mounts(prom)
    config_path = next(
        a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file=")
    )
    by_target = {target: (source, ro) for source, target, ro in mounts}
    assert by_target[config_path] == ("./prometheus/prometheus.yml", True)
    rules_at = str(Path(config_path).parent / "alerts.yml")
    assert by_target[rules_at] == ("./prometheus/alerts.yml", True)

    token = _yaml(PROMETHEUS)["scrape_configs"][0]["authorization"]["credentials_file"]
    holders = [(s, t, ro) for s, t, ro in mounts if token.startswith(t.rstrip("/") + "/")]
    assert len(holders) == 1, f"one mount must hold {token}"
    volume, prom_dir, ro = holders[0]
    assert ro
    # The token is created in the daemon's state volume; a one-shot service copies it.
    state_volume = next(
        s for s, t, _ in _mounts(services["autotuner"]) if t == str(STATE_DIR.parent)
    )
    (copier,) = [
        svc for svc in services.values() if any(s == volume and not ro for s, _, ro in _mounts(svc))
    ]
    copier_mounts = {s: (t, ro) for s, t, ro in _mounts(copier)}
    state_at, state_ro = copier_mounts[state_volume]
    assert state_ro, "the token copier must mount the daemon's state read-only"
    entry = copier["entrypoint"]
    # The read-only metrics token, never the admin token (issue 15, item 8).
    assert str(Path(state_at) / STATE_DIR.relative_to(STATE_DIR.parent) / "metrics_token") in entry
    token_at = copier_mounts[volume][0]
    assert str(Path(token_at) / Path(token).relative_to(prom_dir)) in entry


# --------------------------------------------------------------------------- dashboard


def test_dashboard_is_valid_with_unique_ids_and_a_datasource_variable() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert 36 <= dash["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = list(_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_dashboard_uses_only_exported_metrics() -> None:
    used = set(_METRIC.findall(DASHBOARD.read_text(encoding="utf-8")))
    assert used <= set(METRIC_NAMES), sorted(used - set(METRIC_NAMES))
    wanted = {
        "autotuner_queue_length",
        "autotuner_jobs",
        "autotuner_trials",
        "autotuner_best_goodput",
        "autotuner_promoted_goodput",
        "autotuner_sla_feasible",
        "autotuner_last_promotion_timestamp_seconds",
        "autotuner_regression_verdict",
        "autotuner_regression_goodput_change_ratio",
        "autotuner_engine_info",
        "autotuner_device_leased",
        "autotuner_alerts",
        "autotuner_alerts_undelivered",
    }
    assert wanted <= used, sorted(wanted - used)


# --------------------------------------------------------------------------- daemon config


def test_example_config_validates_with_every_field_at_its_default() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.state_dir == STATE_DIR
    default = DaemonConfig(state_dir=STATE_DIR)
    assert cfg.model_dump() == default.model_dump()


def test_example_config_mentions_every_field() -> None:
    raw = _yaml(EXAMPLE)
    assert set(raw) == set(DaemonConfig.model_fields)
    assert set(raw["regression"]) == set(RegressionSettings.model_fields)
    text = EXAMPLE.read_text(encoding="utf-8")
    for name in Webhook.model_fields:  # shown in a commented example: none is configured
        assert re.search(rf"^#\s+{name}:", text, re.M), name


# --------------------------------------------------------------------------- systemd


def test_systemd_unit() -> None:
    unit = _unit()
    (exec_start,) = unit["ExecStart"]
    assert "autotuner daemon" in exec_start
    assert "--config /etc/autotuner/daemon.yaml" in exec_start
    assert unit["KillMode"] == ["mixed"]
    assert unit["Restart"] == ["on-failure"]
    # Longer than the daemon's own grace for its jobs plus its final kill.
    assert _seconds(unit["TimeoutStopSec"][0]) > STOP_GRACE_S + 10
    assert unit["StateDirectory"] == ["autotuner"]
    assert unit["User"][0] not in ("root", "0")
    assert unit["NoNewPrivileges"] == ["yes"]
    # Each of these would hide /dev/nvidia* from the engines.
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in unit, key
    assert "AUTOTUNER_HOME=/var/lib/autotuner" in unit["Environment"]


# --------------------------------------------------------------------------- container


def _published(service: dict[str, Any]) -> list[str]:
    """host_ip of every published port ('' when it binds every address)."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append(str(p.get("host_ip", "")))
        else:
            parts = str(p).split(":")
            out.append(parts[0] if len(parts) == 3 else "")
    return out


def test_compose_publishes_ports_on_loopback_only() -> None:
    services = _compose()["services"]
    published = 0
    for name, svc in services.items():
        assert svc.get("network_mode", "") != "host", name
        for host_ip in _published(svc):
            assert host_ip == "127.0.0.1", f"{name} publishes on {host_ip or 'every address'}"
            published += 1
    assert published >= 2
    assert _published(services["autotuner"]) == ["127.0.0.1"]


def _binds_every_address(argv: list[str]) -> bool:
    return any(a == "--host" and b == "0.0.0.0" for a, b in itertools.pairwise(argv))


def _dockerfile_argv(instruction: str) -> list[str]:
    found = re.findall(rf"^{instruction}\s+(.+)$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    return json.loads(found[-1]) if found else []


def test_daemon_listens_on_every_address_only_behind_a_loopback_port() -> None:
    daemon = _compose()["services"]["autotuner"]
    docker_text = DOCKERFILE.read_text(encoding="utf-8")
    in_image = _binds_every_address(_dockerfile_argv("CMD")) or bool(
        re.search(r"^(?!#).*--host\W+0\.0\.0\.0", docker_text, re.M)
    )
    in_compose = _binds_every_address(daemon.get("command", []))
    # Inside a container the default 127.0.0.1 is unreachable: someone must widen it ...
    assert in_image or in_compose
    # ... and then the published port is the only guard left besides the token.
    assert _published(daemon) == ["127.0.0.1"]
    assert any(str(p).endswith(f":{DEFAULT_PORT}") for p in daemon["ports"])


def test_compose_daemon_service() -> None:
    daemon = _compose()["services"]["autotuner"]
    devices = daemon["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert daemon["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE.parent / daemon["build"]["context"] / daemon["build"]["dockerfile"]).is_file()
    assert _seconds(daemon["stop_grace_period"]) > STOP_GRACE_S + 10
    mounts = {t: (s, ro) for s, t, ro in _mounts(daemon)}
    assert mounts["/etc/autotuner/daemon.yaml"] == ("./daemon.example.yaml", True)
    assert str(STATE_DIR.parent) in mounts
    assert str(STATE_DIR) in daemon["healthcheck"]["test"]
    for name, svc in _compose()["services"].items():
        for source, _, ro in _mounts(svc):
            if source.startswith("./"):  # files of this folder: read-only, and there
                assert ro and (COMPOSE.parent / source).exists(), f"{name}: {source}"


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    arg = re.search(r"^ARG (\w+)=\S+$", text, re.M)
    assert arg is not None
    assert re.search(rf"^FROM vllm/vllm-openai:\$\{{{arg[1]}\}}$", text, re.M)
    assert re.search(rf"^EXPOSE {DEFAULT_PORT}$", text, re.M)
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1] not in ("root", "0")
    assert _dockerfile_argv("VOLUME") == [str(STATE_DIR.parent)]
    assert f"AUTOTUNER_HOME={STATE_DIR.parent}" in text
    assert _dockerfile_argv("ENTRYPOINT") == ["/usr/local/bin/autotuner-entrypoint"]
    # The image's default config is the example, whose state_dir is in the volume.
    assert _dockerfile_argv("CMD") == ["--config", "/etc/autotuner/daemon.yaml"]
    assert re.search(r"^COPY deploy/daemon.example.yaml /etc/autotuner/daemon.yaml$", text, re.M)
    # The build context is the repository root, cut down by the Dockerfile's ignore file.
    allowed = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for line in re.findall(r"^COPY (?:--\S+ )*(.+)$", text, re.M):
        *sources, _ = line.split()
        for s in sources:
            assert (ROOT / s).exists(), s
            assert s in allowed, f"{s} is not in the build context"


def test_entrypoint_registers_the_image_vllm_then_execs_the_daemon() -> None:
    text = ENTRYPOINT.read_text(encoding="utf-8")
    assert os.access(ENTRYPOINT, os.X_OK)
    assert text.startswith("#!/bin/sh\n")
    assert re.search(r"^set -eu$", text, re.M)
    assert "command -v python3" in text
    add = re.search(r"^autotuner engine add (.+)$", text, re.M)
    assert add is not None and "--replace" in add[1] and "--python" in add[1]
    assert re.search(r'^exec autotuner daemon "\$@"$', text, re.M)
    assert "eval" not in text
    # Every expansion quoted: nothing the environment passes in is split or globbed.
    code = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "$" not in re.sub(r'"[^"]*"', '""', code), code
    if shutil.which("sh"):
        subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)


# --------------------------------------------------------------------------- live metrics


@pytest.fixture()
def scraped(tmp_path: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    """What /metrics says for a store with a promotion that misses its SLA, a failed re-check,
    a regression verdict, a failed job, an alert and a leased GPU: family -> [(labels, value)]."""
    store = Store(tmp_path / "daemon.db")
    try:
        store.add_sla("chat", "name: chat\n", "0 2 * * *", "vllm-new")
        store.update_sla(
            "chat",
            promotion={
                "engine": "vllm-old",
                "label": "trial-3",
                "params": {"max_num_seqs": 64},
                "meets_sla": False,
                "goodput": 4.2,
                "time": time.time() - 3 * 86400,
            },
            summary={"trials": {"COMPLETE": 5, "FAIL": 1}, "best_goodput": 4.5},
        )
        store.add_verdict(
            "chat",
            "vllm-old",
            "vllm-new",
            "regression",
            {"changes": [{"metric": "goodput", "change": -0.12}]},
        )
        store.see_engine("vllm-old", "0.25.0", "vllm", "cuda")
        store.see_engine("vllm-new", "0.26.0", "vllm", "cuda")
        job = store.enqueue("tune", "chat", "vllm-new")
        assert store.claim(job)
        store.finish(job, "failed", exit_code=1, error="boom")
        recheck = store.enqueue("recheck", "chat", "vllm-old")
        assert store.claim(recheck)
        store.finish(recheck, "done", exit_code=1, outcome={"meets_sla": False, "goodput": 3.0})
        store.enqueue("recheck", "chat", "vllm-old")
        store.add_alert("engine_regression", "chat", "critical", "slower", {})
        collector = StoreCollector(store, lambda: {"held": {"gpu0": 7}}, time.time() - 60)
        text = render(make_registry(collector)).decode()
    finally:
        store.close()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return out


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        if name in TARGET_LABELS or "$" in value:  # added by Prometheus / a dashboard variable
            continue
        got = labels.get(name, "")
        ok = {
            "=": got == value,
            "!=": got != value,
            "=~": re.fullmatch(value, got) is not None,
            "!~": re.fullmatch(value, got) is None,
        }[op]
        if not ok:
            return False
    return True


def _check_expr(
    expr: str, scraped: dict[str, list[tuple[dict[str, str], float]]], where: str
) -> set[str]:
    """Every selector of ``expr`` matches an exported sample; returns the labels in play."""
    labels = set(TARGET_LABELS)
    for name, inside in _SELECTOR.findall(expr):
        assert scraped.get(name), f"{where}: {name} has no sample"
        matchers = _MATCHER.findall(inside or "")
        assert any(_matches(lab, matchers) for lab, _ in scraped[name]), (
            f"{where}: no {name} sample matches {{{inside}}}"
        )
        labels |= {k for lab, _ in scraped[name] for k in lab}
    for group in _GROUPING.findall(expr):
        for label in (g.strip() for g in group.split(",") if g.strip()):
            assert label in labels, f"{where}: grouping by unknown label {label!r}"
    return labels


def test_alert_rules_match_live_metrics(
    scraped: dict[str, list[tuple[dict[str, str], float]]],
) -> None:
    referenced = set()
    for rule in _rules():
        referenced |= set(_METRIC.findall(rule["expr"]))
        labels = _check_expr(rule["expr"], scraped, rule["alert"])
        for key in ("summary", "description"):
            for label in _TEMPLATE_LABEL.findall(rule["annotations"][key]):
                assert label in labels, f"{rule['alert']}: $labels.{label} is never set"
    assert referenced <= set(scraped), sorted(referenced - set(scraped))
    # The state built above is what the two main rules fire on.
    verdicts = scraped["autotuner_regression_verdict"]
    assert (
        {
            "sla": "chat",
            "old_engine": "vllm-old",
            "new_engine": "vllm-new",
            "verdict": "regression",
        },
        1.0,
    ) in verdicts
    assert scraped["autotuner_sla_feasible"] == [({"sla": "chat"}, 0.0)]


def test_dashboard_queries_match_live_metrics(
    scraped: dict[str, list[tuple[dict[str, str], float]]],
) -> None:
    for expr, legend in _dashboard_exprs():
        labels = _check_expr(expr, scraped, expr)
        for label in _LEGEND_LABEL.findall(legend):
            assert label in labels, f"{expr}: legend uses {label!r}"
