"""The human-facing files of a promoted bundle: the Pareto plot and table (pareto_chart), the
latency breakdown (latency_chart), the fallback runbook and the triggers it lists
(fallback_plan), in the words of metric_names; this module names them in one place.

Contract: every function is pure — frozen dataclasses (or plain dicts) in, the file's whole
content out as a string; the caller (promote) gathers the data and writes the files
atomically. Nothing reads the study, the clock or the machine, so the same inputs give
byte-identical files and bundles diff cleanly.

SVGs are hand-written SVG 1.1 with inline attributes only (no script, no external fonts; the
building blocks are :mod:`autotuner.bundle.svg`), so they render the same in browsers and in
rsvg; every marker and bar carries a ``class`` and a ``<title>`` (hover text, and something
for tests to count). Missing values (``None``, NaN) are skipped, never plotted as zero.
"""

from __future__ import annotations

from autotuner.bundle.fallback_plan import Fallback as Fallback
from autotuner.bundle.fallback_plan import fallback_plan_md as fallback_plan_md
from autotuner.bundle.fallback_plan import trigger_sentences as trigger_sentences
from autotuner.bundle.latency_chart import LatencyProfile as LatencyProfile
from autotuner.bundle.latency_chart import latency_breakdown_svg as latency_breakdown_svg
from autotuner.bundle.latency_chart import sla_limits as sla_limits
from autotuner.bundle.metric_names import Better as Better
from autotuner.bundle.metric_names import format_change as format_change
from autotuner.bundle.metric_names import format_value as format_value
from autotuner.bundle.metric_names import metric_better as metric_better
from autotuner.bundle.metric_names import metric_label as metric_label
from autotuner.bundle.metric_names import metric_name as metric_name
from autotuner.bundle.metric_names import metric_unit as metric_unit
from autotuner.bundle.pareto_chart import Point as Point
from autotuner.bundle.pareto_chart import pareto_csv as pareto_csv
from autotuner.bundle.pareto_chart import pareto_svg as pareto_svg
