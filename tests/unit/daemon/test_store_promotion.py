"""Promotions in daemon.db: written and read as the typed record; rows written as plain
dicts by older daemons still load, and a row that is not a promotion is refused (issue 26)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from autotuner.daemon.errors import StoreDamaged
from autotuner.daemon.store import Store
from autotuner.records.promotion import Promotion
from tests.unit.records.test_promotion import OLD_ROW


def _store_with_row(path: Path, promotion: object) -> None:
    store = Store(path)
    try:
        assert store.add_sla("p", "name: p\n", "0 3 * * *", "eng-a")
    finally:
        store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE slas SET promotion=?, fallback=?", (json.dumps(promotion),) * 2)
    db.commit()
    db.close()


def test_an_old_dict_row_loads_as_a_promotion_and_is_written_back_typed(tmp_path: Path) -> None:
    _store_with_row(tmp_path / "daemon.db", OLD_ROW)
    store = Store(tmp_path / "daemon.db")
    try:
        row = store.get_sla("p")
        assert row is not None and isinstance(row.promotion, Promotion)
        assert row.promotion == Promotion.from_json(OLD_ROW) == row.fallback
        assert row.to_dict()["promotion"] == row.promotion.to_json()
        newer = Promotion(label="trial-5", params={"max_num_seqs": 16}, meets_sla=False)
        store.update_sla("p", promotion=newer, fallback=row.promotion)
        again = store.get_sla("p")
        assert again is not None and again.promotion == newer
        assert again.fallback == row.promotion
    finally:
        store.close()


def test_a_hostile_promotion_row_is_refused_when_the_store_opens(tmp_path: Path) -> None:
    _store_with_row(tmp_path / "daemon.db", {**OLD_ROW, "meets_sla": "yes"})
    with pytest.raises(StoreDamaged, match="column promotion: meets_sla must be true or false"):
        Store(tmp_path / "daemon.db")


def test_a_hostile_promotion_is_never_written(tmp_path: Path) -> None:
    store = Store(tmp_path / "daemon.db")
    try:
        assert store.add_sla("p", "name: p\n", "0 3 * * *", "eng-a")
        with pytest.raises(ValueError, match="goodput must be a number"):
            store.update_sla("p", promotion={**OLD_ROW, "goodput": "lots"})
        row = store.get_sla("p")
        assert row is not None and row.promotion is None
    finally:
        store.close()
