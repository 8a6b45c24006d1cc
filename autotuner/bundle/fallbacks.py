"""The ranked fallbacks of a promoted config (:mod:`autotuner.bundle.fallback_roles` picks
them), with what each costs against it and when to switch to it, as ``fallback_plan.md``
lists them.
"""

from __future__ import annotations

from autotuner.bundle import fallback_roles, lossy_tier, report
from autotuner.bundle.context import Context
from autotuner.bundle.deploy_files import serve_argv
from autotuner.bundle.figures import SUMMARY, Figures, config_label
from autotuner.search.launched import candidates
from autotuner.search.pareto import Candidate, rank


def ranked_fallbacks(
    ctx: Context,
    chosen: Candidate,
    ranked: list[Candidate],
    base: Candidate | None,
    figures: Figures,
) -> list[report.Fallback]:
    directions = [o.direction for o in ctx.sla.objectives]
    # A candidate that missed the SLA in a confirmation replicate is no fallback for it.
    usable = [c for c in ranked if not figures.rejected(c)]
    feasible = rank(
        [c for c in candidates(ctx.study) if c.feasible and not figures.rejected(c)], directions
    )
    traits = lossy_tier.traits(ctx)
    picks = fallback_roles.pick(
        chosen, usable, feasible, base, traits, ctx.hardware.device, engine_roles=ctx.engine.roles
    )
    promoted = figures.metrics(chosen)
    out = []
    for i, fallback in enumerate(picks, 1):
        c = fallback.cand
        mine = figures.metrics(c)
        cost = {}
        for m in SUMMARY:
            a, b = mine.get(m), promoted.get(m)
            cost[m] = (a - b) / b if a is not None and b not in (None, 0) else None
        what = fallback.title
        change = figures.capacity_change(c, chosen)
        both = config_label(c) in figures.replicates and config_label(chosen) in figures.replicates
        out.append(
            report.Fallback(
                rank=i,
                label=what,
                params=c.params,
                argv=serve_argv(ctx, c.params),
                metrics={m: mine.get(m) for m in SUMMARY},
                cost=cost,
                triggers=report.trigger_sentences(
                    c.params,
                    mine,
                    promoted_params=chosen.params,
                    promoted_metrics=promoted,
                    is_baseline=c.baseline,
                    roles=ctx.engine.roles,
                    rate_margin=ctx.sla.tune.capacity_resolution,
                    rate_settled=both,
                    rate_basis=None if both else "single runs of the search, not confirmed",
                ),
                basis=figures.basis(c, SUMMARY),
                change_text={"capacity": change} if change else {},
            )
        )
    return out
