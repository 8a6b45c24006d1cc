"""Typed records: every JSON file (and Optuna attribute set) the tuner writes and reads back.

Each record is a pydantic model with a ``schema_version``, written and read by the same
class. A file without the field predates it and reads as version 0; a version this autotuner
does not know raises :class:`RecordVersionError`.

==========================  ===================================  =============================
record                      where                                written by / read by
==========================  ===================================  =============================
TrialRecord, StudyRecord    Optuna user attributes of the study  search.study, bundle.promote /
                                                                 study, promote, summary, tune,
                                                                 daemon
TrialFile                   <study>/trial-NNN/trial.json,        search.trial, ray_executor /
                            <study>/confirm/*/trial.json         promote, placement
BenchResult                 bench's result.json, --output        measure.bench / daemon re-check
Manifest                    promoted/optimization_manifest.json, bundle.promote / summary,
                            no_promotion.json                    measure.regress, daemon
EngineComparison,           compare-engines' result.json and     measure.regress / daemon,
ReplicateLine               replicates.jsonl                     regress (resume)
EngineRegistry              <home>/engines/registry.json         engines.envs
SynthMarker                 <model dir>/autotuner-synth.json     models.synth
DaemonInfo                  <daemon state>/daemon.json           daemon service / daemon client
JobOutcome                  the file named by --outcome (tune,   cli.outcome / daemon
                            bench, compare-engines)
StudyLockFile               <study>/tune.lock (who holds it)     search.lock / search.lock
ProcessOwner                part of StudyLockFile and of         search.lock, search.study /
                            TrialRecord (``owner``)              search.study (start-up sweep)
ConfirmPlanFile             <study>/confirm/plan.json (the last  search.confirm_plan /
                            confirmation's, marked finished)     search.confirm_plan
DoctorReport                `autotuner doctor --json`, <daemon   doctor.run / daemon
                            state>/engine-checks/<name>.json     engine_checks, status
==========================  ===================================  =============================
"""

from __future__ import annotations

from autotuner.records.base import LEGACY, Record, RecordError, RecordVersionError

__all__ = ["LEGACY", "Record", "RecordError", "RecordVersionError"]
