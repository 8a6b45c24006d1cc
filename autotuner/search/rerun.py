"""A finished study run again: its decision is reprinted, not confirmed again.

Confirmation re-measures the leaders and the baseline in interleaved replicates (six launches,
about ten minutes on the CPU quick start). Running ``tune`` again on a study whose budget is
spent and whose decision is recorded would repeat all of it for the same answer; it reprints
the decision and where the bundle is instead, and exits as the first run did. The same holds
when a run launched nothing new (a grid or a space with nothing left to try).
``tune --reconfirm`` confirms again; ``--extra-trials N`` (or a larger ``--trials``) searches
further, then decides anew; a larger ``tune.confirm.replicates`` than the decision's
confirmation had extends it (only the added replicates are launched: search.confirm_plan), and
2 or more where the decision was taken with 1 (so without a confirmation) runs one.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotuner.core.errors import BadInput
from autotuner.records.manifest import Manifest
from autotuner.records.trial import StudyRecord
from autotuner.search.study import counted
from autotuner.sla.spec import parse_sla


def launches(study: optuna.Study) -> set[int]:
    """The trials that spent the budget (launched an engine)."""
    return {t.number for t in study.get_trials(deepcopy=False) if counted(t)}


def recorded_decision(study: optuna.Study, study_dir: Path, replicates: int) -> Manifest | None:
    """The manifest of the study's recorded decision while it is still the study's answer:
    the bundle in ``promoted/`` is the one that decision wrote, every launch the study counts
    was known to it, and a confirmation it ran had at least ``replicates`` (the SLA's
    ``tune.confirm.replicates``; more asked for extends it). None otherwise (decide as usual)."""
    note = StudyRecord.from_attrs(study.user_attrs, study.study_name).promotion
    if note is None:
        return None
    manifest = Manifest.read_or_none(study_dir / "promoted" / "optimization_manifest.json")
    if manifest is None or manifest.promoted is None or manifest.created != note.time:
        return None  # no bundle, or another decision's
    provenance = manifest.provenance
    known = set(provenance.study.trials) if provenance and provenance.study else set()
    if not launches(study) <= known:
        return None  # launches after the decision: it has to be taken again
    ran = replicates_run(manifest)
    if ran and ran < replicates:
        return None  # more replicates asked for: the confirmation is extended
    if not ran and replicates >= 2 and (replicates_asked(manifest) or 2) < 2:
        return None  # decided with 1 replicate, so without a confirmation: one can run now
    return manifest


def replicates_run(manifest: Manifest) -> int:
    """How many replicates per config the decision's confirmation ran (0: none)."""
    confirmation = manifest.measurements.confirmation if manifest.measurements else None
    return len({r.replicate for r in confirmation.replicates}) if confirmation else 0


def replicates_asked(manifest: Manifest) -> int | None:
    """The ``tune.confirm.replicates`` of the SLA the decision was taken with (None: the
    manifest's copy of the SLA is missing or no longer valid)."""
    if manifest.sla is None:
        return None
    try:
        return parse_sla(manifest.sla.file).tune.confirm.replicates
    except BadInput:
        return None


def describe(manifest: Manifest, launched: int) -> list[str]:
    """What the reprint says: the decision, and how to get another one."""
    promoted = manifest.promoted
    assert promoted is not None  # recorded_decision returns only a promotion
    meets = "meets the SLA" if promoted.meets_sla else "does NOT meet the SLA"
    reason = manifest.decision.reason if manifest.decision is not None else ""
    tier = [] if manifest.lossy_tier is None else [f"lossy tier: {manifest.lossy_tier.why}"]
    ran = replicates_run(manifest)
    more = ""
    if ran:
        more = (
            f", or raise tune.confirm.replicates above {ran} to add replicates to its confirmation"
        )
    elif replicates_asked(manifest) == 1:
        more = ", or set tune.confirm.replicates to 2 or more to confirm it"
    return [
        f"study {manifest.study} is finished: {launched} launches counted, decided at "
        f"{manifest.created}; nothing to launch",
        f"promoted {promoted.label}, which {meets}: {reason}",
        *tier,
        "run with --reconfirm to measure the confirmation again, --extra-trials N to search "
        f"further{more}",
    ]
