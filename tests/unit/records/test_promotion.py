"""The promotion record: its JSON round trip, how it reads a manifest, and stored rows read
back as hostile input (issue 26)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from autotuner.records.base import RecordError
from autotuner.records.manifest import (
    Confirmation,
    Manifest,
    Measurements,
    PromotedConfig,
    Provenance,
    SearchMeasurement,
    Spread,
)
from autotuner.records.promotion import Promotion

# A row as daemons before this record wrote it (daemon/jobs.py promotion_from).
OLD_ROW: dict[str, Any] = {
    "engine": "eng-a",
    "engine_version": "vllm 0.32.0",
    "bundle": "/state/bundles/p/eng-a",
    "label": "trial-3",
    "params": {"max_num_seqs": 8, "enforce_eager": True, "kv": {"dtype": "auto"}},
    "meets_sla": True,
    "goodput": 2.5,
    "goodput_spread": None,
    "load": 2.0,
    "manifest_created": "2026-12-01T03:00:00+00:00",
    "time": 1764558000.5,
}


def test_a_promotion_survives_its_json_round_trip() -> None:
    p = Promotion(
        label="trial-3",
        params={"max_num_seqs": 8, "quantization": None},
        meets_sla=True,
        goodput=2.5,
        load=2.0,
        engine_version="vllm 0.32.0",
        manifest_created="2026-12-01T03:00:00+00:00",
        engine="eng-a",
        bundle="/b",
        time=12.0,
    )
    assert Promotion.from_json(json.loads(json.dumps(p.to_json()))) == p
    bare = Promotion(label=None)
    assert Promotion.from_json(json.loads(json.dumps(bare.to_json()))) == bare


def test_a_row_written_before_the_record_still_loads() -> None:
    p = Promotion.from_json(OLD_ROW)
    assert (p.engine, p.label, p.meets_sla, p.goodput, p.load) == (
        "eng-a",
        "trial-3",
        True,
        2.5,
        2.0,
    )
    assert p.params == OLD_ROW["params"] and p.time == 1764558000.5
    assert "goodput_spread" not in p.to_json()  # always None: not carried on
    # Rows a test or an older daemon wrote with fewer keys: the rest is unknown.
    short = Promotion.from_json({"engine": "eng-a", "label": "baseline", "meets_sla": False})
    assert short.params == {} and short.goodput is None and short.time is None
    assert Promotion.from_json({**OLD_ROW, "goodput": 2}).goodput == 2.0


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ([1, 2], "a JSON object was expected, found list"),
        ("trial-3", "a JSON object was expected, found str"),
        ({**OLD_ROW, "meets_sla": "yes"}, "meets_sla must be true or false, found str"),
        ({k: v for k, v in OLD_ROW.items() if k != "meets_sla"}, "meets_sla is missing"),
        ({**OLD_ROW, "goodput": "2.5"}, "goodput must be a number, found str"),
        ({**OLD_ROW, "goodput": True}, "goodput must be a number, found bool"),
        ({**OLD_ROW, "time": math.inf}, "time must be finite"),
        ({**OLD_ROW, "load": math.nan}, "load must be finite"),
        ({**OLD_ROW, "label": 3}, "label must be text, found int"),
        ({**OLD_ROW, "engine": ["eng-a"]}, "engine must be text, found list"),
        ({**OLD_ROW, "params": [8]}, "params must be an object, found list"),
        (
            {**OLD_ROW, "params": {"max_num_seqs": [8]}},
            "params: max_num_seqs has a value of type list",
        ),
        ({**OLD_ROW, "rm -rf": 1}, "unknown field(s) rm -rf"),
    ],
)
def test_a_hostile_row_is_refused_naming_the_field(row: object, said: str) -> None:
    with pytest.raises(RecordError) as err:
        Promotion.from_json(row, "slas row 'p'")
    assert str(err.value).startswith("slas row 'p': ") and said in str(err.value)


def _manifest(confirmed: float | None, searched: float | None) -> Manifest:
    spread = {} if confirmed is None else {"trial-3": {"goodput": Spread(mean=confirmed)}}
    return Manifest(
        created="2026-12-01T03:00:00+00:00",
        study="p",
        promoted=PromotedConfig(label="trial-3", params={"max_num_seqs": 8}, meets_sla=True),
        measurements=Measurements(
            search=SearchMeasurement(trial=3, at_sla_load={"goodput": searched}),
            confirmation=Confirmation(load=1.5 if confirmed else None, spread=spread),
        ),
        provenance=Provenance(engine_version="vllm 0.32.0"),
    )


def test_from_a_manifest_goodput_is_the_confirmed_mean_else_the_search_run() -> None:
    p = Promotion.from_manifest(_manifest(3.0, 2.0), engine="eng-a", bundle="/b", time=7.0)
    assert p is not None
    assert (p.label, p.params, p.meets_sla, p.goodput, p.load) == (
        "trial-3",
        {"max_num_seqs": 8},
        True,
        3.0,
        1.5,
    )
    assert (p.engine_version, p.manifest_created) == ("vllm 0.32.0", "2026-12-01T03:00:00+00:00")
    assert (p.engine, p.bundle, p.time) == ("eng-a", "/b", 7.0)
    single = Promotion.from_manifest(_manifest(None, 2.0))
    assert single is not None and single.goodput == 2.0 and single.load is None
    assert single.engine is None and single.time is None
    nothing = _manifest(None, None).model_copy(update={"promoted": None})
    assert Promotion.from_manifest(nothing) is None
