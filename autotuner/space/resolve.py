"""Resolution of a parsed space file for one context and an SLA's overrides: what is tuned
over which domain, what is pinned, what is dropped and why."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from autotuner.core.show import show_value
from autotuner.core.types import same_value
from autotuner.space.check import _option_rule
from autotuner.space.conditions import Condition
from autotuner.space.context import _Context, _unmet
from autotuner.space.overrides import ParamOverride
from autotuner.space.resolved import Dropped, ParamSpec
from autotuner.space.schema import _Decl, _File, _Hopeless, _Not, _Prior
from autotuner.space.strategy import ByLimit, Hopeless, Monotone, Prior
from autotuner.space.values import Device, ParamValue, _check_type, _kind, _member
from autotuner.space.versions import version_in


def _outside_limits(d: _Decl, value: ParamValue) -> str | None:
    """Why a number the SLA gives is outside what the engine accepts (None: inside)."""
    if d.limits is None or not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return _option_rule(d).problem(value)


def _is_lossy(d: _Decl, value: ParamValue) -> bool:
    if isinstance(d.lossy, bool):
        return d.lossy
    return _member(value, d.lossy)


def _merged(d: _Decl, device: Device) -> tuple[_Decl, ParamValue, bool]:
    """The declaration with its per-device variant applied, the device pin, and if pinned."""
    v = d.per_device.get(device)
    if v is None:
        return d, None, False
    update: dict[str, Any] = {
        k: getattr(v, k)
        for k in ("low", "high", "log", "step", "choices", "prior")
        if k in v.model_fields_set
    }
    return d.model_copy(update=update), v.fixed, "fixed" in v.model_fields_set


def _available(d: _Decl, ctx: _Context) -> bool:
    return version_in(ctx.version, d.versions) and d.devices in ("both", ctx.device)


class _Resolver:
    """Turns a file + context + overrides into a SearchSpace, collecting problems."""

    def __init__(
        self,
        spec: _File,
        ctx: _Context,
        overrides: Mapping[str, ParamOverride],
        engine_params: Mapping[str, ParamValue],
    ) -> None:
        self.spec = spec
        self.ctx = ctx
        self.overrides = overrides
        self.engine_params = engine_params
        self.decls = {d.name: d for d in spec.params}
        self.problems: list[str] = []
        self.params: list[ParamSpec] = []
        self.fixed: dict[str, ParamValue] = dict(engine_params)
        self.fixed_by: dict[str, str] = dict.fromkeys(engine_params, "engine.params")
        self.dropped: list[Dropped] = []
        self.static: dict[str, ParamValue] = {}  # values of untuned params, for conditions

    def run(self) -> None:
        for name in self.overrides:
            if name not in self.decls:
                close = difflib.get_close_matches(name, list(self.decls), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.problems.append(f"search.{name}: not a parameter of the space{hint}")
            elif name in self.engine_params:
                self.problems.append(
                    f"search.{name}: also set in engine.params; give it in one place only"
                )
        for d in self.spec.params:
            self._resolve(d)

    def _drop(self, d: _Decl, reason: str) -> None:
        self.dropped.append(Dropped(d.name, reason))
        self.static.setdefault(d.name, d.default)

    def _pin(self, d: _Decl, value: ParamValue, by: str) -> None:
        self.fixed[d.name] = value
        self.fixed_by[d.name] = by
        self.static[d.name] = value

    def _resolve(self, d: _Decl) -> None:
        ctx = self.ctx
        ov = self.overrides.get(d.name, ParamOverride())
        at = f"search.{d.name}"
        if d.name in self.engine_params:  # already in fixed, as the SLA gave it
            self.static[d.name] = self.engine_params[d.name]
            return
        if not version_in(ctx.version, d.versions):
            if ov.is_fixed or ov.searches:
                self.problems.append(
                    f"{at}: {ctx.version_text} has no such option (needs {d.versions})"
                )
            self._drop(d, f"needs {self.spec.engine} {d.versions} (have {ctx.version_text})")
            return
        if ov.exclude:
            self._drop(d, "excluded by the SLA (the engine decides)")
            return
        if ov.is_fixed:
            self._resolve_fixed(d, ov.fixed, at)
            return
        eff, pin, pinned = _merged(d, ctx.device)
        if d.devices not in ("both", ctx.device):
            if ov.searches:
                self.problems.append(
                    f"{at}: not searched on {ctx.device} ({d.devices} only); use 'fixed'"
                )
            self._drop(d, f"{d.devices} only")
            return
        if pinned and not ov.searches:
            self._pin(d, pin, f"pinned on {ctx.device}")
            return
        # One knob per effect: where the newer option exists, the older one is not searched
        # (searching both would mostly repeat configurations), unless the SLA asks for it.
        sup = self.decls.get(d.superseded_by or "")
        if sup is not None and _available(sup, ctx) and not ov.searches:
            self._drop(d, f"superseded by {sup.name} in this version")
            return
        if not d.search and not ov.searches:
            self._drop(d, "off by default (the SLA's search: section can switch it on)")
            return
        spec = self._domain(eff, ov, at)
        if spec is None:
            return
        self._place(d, spec)

    def _resolve_fixed(self, d: _Decl, value: ParamValue, at: str) -> None:
        if not _check_type(d.type, value):
            self.problems.append(f"{at}.fixed: {show_value(value)} is not {_kind(d.type)}")
            return
        if (why := _outside_limits(d, value)) is not None:
            self.problems.append(f"{at}.fixed: {why}")
            return
        if _is_lossy(d, value) and not self.ctx.allow_lossy:
            self.problems.append(
                f"{at}.fixed: {show_value(value)} changes outputs; set search.allow_lossy: true"
            )
            return
        for req in d.requires:
            why = _unmet(req, value, self.ctx)
            if why is not None:
                self.problems.append(f"{at}.fixed: {show_value(value)} {why}")
                return
        self._pin(d, value, "SLA search")

    def _domain(self, d: _Decl, ov: ParamOverride, at: str) -> ParamSpec | None:
        """The effective domain after the override and hardware/lossy filtering."""
        ctx = self.ctx
        choices: list[ParamValue] | None
        if ov.values is not None:
            bad = [v for v in ov.values if not _check_type(d.type, v)]
            if bad:
                self.problems.append(f"{at}.values: {show_value(bad[0])} is not {_kind(d.type)}")
                return None
            outside = [w for v in ov.values if (w := _outside_limits(d, v)) is not None]
            if outside:
                self.problems.append(f"{at}.values: {outside[0]}")
                return None
            lossy = [v for v in ov.values if _is_lossy(d, v)]
            if lossy and not ctx.allow_lossy:
                shown = show_value(lossy[0])
                self.problems.append(
                    f"{at}.values: {shown} changes outputs; set search.allow_lossy: true"
                )
                return None
            choices = list(ov.values)
        elif d.type == "bool":
            choices = d.choices if d.choices is not None else [False, True]
        else:
            choices = d.choices
        low, high, log = d.low, d.high, d.log
        if choices is not None and any(x is not None for x in (ov.low, ov.high, ov.log)):
            self.problems.append(f"{at}: has a set of choices; narrow it with 'values'")
            return None
        if choices is None:
            for name, bound in (("low", ov.low), ("high", ov.high)):
                if bound is not None and not _check_type(d.type, bound):
                    self.problems.append(f"{at}.{name}: {show_value(bound)} is not {_kind(d.type)}")
                    return None
            low = ov.low if ov.low is not None else low
            high = ov.high if ov.high is not None else high
            log = ov.log if ov.log is not None else log
            assert low is not None and high is not None
            if low > high:
                self.problems.append(f"{at}: low ({show_value(low)}) > high ({show_value(high)})")
                return None
            if log and low <= 0:
                self.problems.append(f"{at}: a log range needs low > 0")
                return None
            for name, bound in (("low", ov.low), ("high", ov.high)):
                if bound is not None and (why := _outside_limits(d, bound)) is not None:
                    self.problems.append(f"{at}.{name}: {why}")
                    return None
        else:
            kept: list[ParamValue] = []
            for c in choices:
                reason = next(
                    (r for req in d.requires if (r := _unmet(req, c, ctx)) is not None), None
                )
                if reason is None and _is_lossy(d, c) and not ctx.allow_lossy:
                    reason = "changes outputs (lossy); allow with search.allow_lossy: true"
                if reason is None:
                    kept.append(c)
                else:
                    self.dropped.append(Dropped(d.name, reason, c, is_choice=True))
            choices = kept
            if not choices:
                self._drop(d, "no value left to search")
                return None
        step = None if log else d.step
        return ParamSpec(
            name=d.name,
            type=d.type,
            low=None if choices is not None else low,
            high=None if choices is not None else high,
            log=bool(log) if choices is None else False,
            step=step if choices is None else None,
            choices=tuple(choices) if choices is not None else None,
            default=d.default,
            why=" ".join(d.why.split()),
            prior=_prior(d.prior),
            hopeless=tuple(_hopeless(d.name, h) for h in d.hopeless_when),
            monotone=tuple(
                Monotone(d.name, tuple(m.limits), m.worse, " ".join(m.why.split()))
                for m in d.monotone
            ),
        )

    def _place(self, d: _Decl, spec: ParamSpec) -> None:
        """Single-valued domains become pins (or drops); static conditions are decided."""
        single: list[ParamValue] | None = None
        if spec.choices is not None and len(spec.choices) == 1:
            single = [spec.choices[0]]
        elif spec.choices is None and spec.low == spec.high:
            single = [spec.low]
        if single is not None:
            if same_value(single[0], d.default):
                self._drop(d, f"only the default ({show_value(d.default)}) remains")
            else:
                self._pin(d, single[0], "only value left")
            return
        tuned = {p.name for p in self.params}
        dynamic: list[Condition] = []
        for parent, rule in d.when.items():
            negate = isinstance(rule, _Not)
            vals = tuple(rule.not_ if isinstance(rule, _Not) else rule)
            cond = Condition(parent, vals, negate)
            if parent in tuned:
                dynamic.append(cond)
            elif not cond.holds(self.static.get(parent, self.decls[parent].default)):
                value = self.static.get(parent, self.decls[parent].default)
                self._drop(d, f"inactive: {parent} is {show_value(value)}")
                return
        self.params.append(
            ParamSpec(
                name=spec.name,
                type=spec.type,
                low=spec.low,
                high=spec.high,
                log=spec.log,
                step=spec.step,
                choices=spec.choices,
                default=spec.default,
                when=tuple(dynamic),
                why=spec.why,
                prior=spec.prior,
                hopeless=spec.hopeless,
                monotone=spec.monotone,
            )
        )


def _condition(parent: str, rule: list[ParamValue] | _Not) -> Condition:
    if isinstance(rule, _Not):
        return Condition(parent, tuple(rule.not_), negate=True)
    return Condition(parent, tuple(rule))


def _prior(p: _Prior | None) -> Prior | None:
    if p is None or p.rank is None:
        return None
    by_limit = tuple(
        ByLimit(tuple(b.limits), tuple(b.first), tuple(b.times), " ".join(b.why.split()))
        for b in p.by_limit
    )
    return Prior(p.rank, tuple(p.first), p.near, tuple(p.times), by_limit)


def _hopeless(param: str, h: _Hopeless) -> Hopeless:
    return Hopeless(
        param=param,
        why=" ".join(h.why.split()),
        values=tuple(h.values) if h.values is not None else None,
        below=h.below,
        times=h.times,
        with_=tuple(_condition(k, r) for k, r in h.with_.items()),
        device=h.device,
        objective=h.objective,
        unless_objective=tuple(h.unless_objective),
        limited=tuple(h.limited),
    )
