"""Writing a promoted bundle: every file into a fresh directory, swapped in whole as
``promoted/`` so that readers see the previous bundle or the new one, never half of one.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from autotuner.bundle import fallback_roles, lossy_tier, page, report
from autotuner.bundle.context import Context
from autotuner.bundle.deploy_files import write_deploy_files
from autotuner.bundle.fallbacks import ranked_fallbacks
from autotuner.bundle.figures import CONFIRMED_METRICS, SUMMARY, Figures
from autotuner.bundle.latency_chart import launch_profile
from autotuner.measure.kernels import KernelBreakdown, breakdown_csv
from autotuner.records.manifest import Manifest
from autotuner.search.launched import candidates, trial_file
from autotuner.search.pareto import Candidate
from autotuner.sla.load import load_unit


def write_bundle(
    ctx: Context,
    manifest: Manifest,
    chosen: Candidate,
    front: list[Candidate],
    ranked: list[Candidate],
    *,
    kernels: Sequence[tuple[str, KernelBreakdown]] = (),
) -> Path:
    """Write every artifact into a fresh directory and swap it in as ``promoted/``;
    ``kernels`` (label, profiled window) add ``kernel_breakdown.csv`` and the kernel panel."""
    final = ctx.study_dir / "promoted"
    tmp = ctx.study_dir / f".promoted.{int(time.time() * 1000)}.tmp"
    (tmp / "deploy").mkdir(parents=True)
    sla = ctx.sla
    objs = [o.metric for o in sla.objectives]
    front_ids = {c.trial for c in front}
    cands = candidates(ctx.study)
    base = next((c for c in cands if c.baseline), None)
    figures = Figures.of(manifest)
    points = [
        report.Point(
            trial=c.trial,
            values={
                m: figures.metrics(c).get(m, v) if m in CONFIRMED_METRICS else v
                for m, v in zip(objs, c.values, strict=True)
            },
            feasible=c.feasible,
            on_front=c.trial in front_ids,
            promoted=c.trial == chosen.trial,
            baseline=c.baseline,
            params=c.params,
            basis=figures.point_basis(c),
        )
        for c in cands
    ]
    manifest.write(tmp / "optimization_manifest.json")
    ctx.hardware.write_csv(tmp / "hardware_profile.csv")
    (tmp / "pareto.csv").write_text(
        report.pareto_csv(points, list(dict.fromkeys([*objs, "p99_ttft_ms"])), figures=True)
    )
    better = {o.metric: ("max" if o.direction == "maximize" else "min") for o in sla.objectives}
    y = objs[1] if len(objs) > 1 else None
    (tmp / "pareto.svg").write_text(
        report.pareto_svg(
            points,
            objs[0],
            y,
            x_better=better[objs[0]],  # type: ignore[arg-type]
            y_better=better.get(y or "", "min"),  # type: ignore[arg-type]
            title=f"{sla.name}: trials",
            notes=manifest.pareto_notes,
        )
    )
    shown = [(chosen, "promoted")]
    if base is not None and base.trial != chosen.trial:
        shown.append((base, "baseline"))
    profiles = []
    for cand, what in shown:
        tr = trial_file(ctx, cand.trial)
        prof = launch_profile(
            None if tr is None else tr.to_record(), f"{what} (trial {cand.trial})"
        )
        profiles.append(prof)
    (tmp / "latency_breakdown.svg").write_text(
        report.latency_breakdown_svg(
            [p for p in profiles if p is not None],
            title=f"{sla.name}: latency at the SLA's load",
            kernels=kernels,
            limits=report.sla_limits(
                [(c.metric, c.limit) for c in sla.constraints if c.bound == "max"]
            ),
        )
    )
    if kernels:
        (tmp / "kernel_breakdown.csv").write_text(breakdown_csv(kernels))
    reason = manifest.decision.reason if manifest.decision else ""
    if figures.replicates or figures.missed:
        where = (
            "capacity and goodput at capacity marked 'mean of N replicates' come from the "
            "confirmation replicates; every figure marked 'single run' is one launch of the "
            "search (latencies at the SLA's own load)"
        )
        if any(figures.missed.values()):
            where += (
                "; a replicate that missed the SLA at its own load is counted as a miss, never "
                "averaged in as capacity 0"
            )
    else:
        where = "no confirmation launch was run: every figure is a single run of the search"
    fallbacks = ranked_fallbacks(ctx, chosen, ranked, base, figures)
    traits = lossy_tier.traits(ctx)
    needs = fallback_roles.hardware_notes(
        chosen.params, fallbacks, traits, ctx.hardware.device, load_unit(sla)
    )
    (tmp / "fallback_plan.md").write_text(
        report.fallback_plan_md(
            sla.name,
            f"{'baseline (engine defaults)' if chosen.baseline else f'trial {chosen.trial}'}",
            {m: figures.metrics(chosen).get(m) for m in SUMMARY},
            fallbacks,
            [
                *needs,
                reason,
                *figures.rejected_notes(cands, chosen),
                where,
                f"engine: {ctx.engine_version}; hardware: {ctx.hardware.summary().splitlines()[0]}",
            ],
            promoted_basis=figures.basis(chosen, SUMMARY),
        )
    )
    if manifest.lossy_tier is not None:
        md = lossy_tier.lossy_tier_md(sla.name, manifest.lossy_tier, load_unit(sla))
        (tmp / "lossy_tier.md").write_text(md)
    write_deploy_files(ctx, tmp / "deploy", chosen)
    # the study as one page; it reads this bundle's manifest
    page.write(ctx.study, ctx.study_dir, tmp / "report.html", bundle=tmp)
    _swap(tmp, final)
    return final


def _swap(tmp: Path, final: Path) -> None:
    """Replace ``final`` by ``tmp``; a crash leaves either the old or the new bundle."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)
