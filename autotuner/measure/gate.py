"""The quality gate on real engines: launch the lossless baseline, then the lossy candidate,
ask each for greedy completions of the same prompts, compare (:mod:`autotuner.measure.quality`).

The two engines run one after the other (never side by side: on a shared host the second
would change the first one's numerics only through timing, but it would need twice the
memory). Requests go one at a time, so each completion is computed alone, as a batch of one:
batching changes floating-point reduction order and would show up as a difference of its own.
Prompts are the SLA dataset's first ``quality.prompts`` rows, else built-in ones. A model
served with random weights (``--load-format dummy``) is not measured at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from autotuner.core.paths import atomic_write_text
from autotuner.core.types import ParamValue
from autotuner.engines.base import EngineAdapter, EngineLaunchError
from autotuner.measure.launch import engine_params, make_engine
from autotuner.measure.quality import (
    DUMMY_WEIGHTS,
    Completion,
    GateResult,
    builtin_prompts,
    compare,
    dataset_prompts,
    judge,
    unmeasurable,
)
from autotuner.models import synth
from autotuner.sla.quality import QualitySpec
from autotuner.sla.spec import Sla
from autotuner.workload.datafiles import DataFileError
from autotuner.workload.datasets import read_dataset

Say = Callable[[str], None]


def quality_of(sla: Sla) -> QualitySpec:
    """The SLA's ``quality:`` section (its defaults where the SLA has none)."""
    spec = getattr(sla, "quality", None)
    return spec if isinstance(spec, QualitySpec) else QualitySpec()


def random_weights(
    engine: EngineAdapter, model_dir: Path, params: Mapping[str, ParamValue]
) -> bool:
    """Whether ``engine`` serves random weights: no weight files, or the engine's own
    options for random weights (vLLM: ``load_format: dummy``) among ``params``."""
    if synth.needs_dummy_load(model_dir):
        return True
    dummy = engine.random_weights
    return bool(dummy) and all(params.get(k) == v for k, v in dummy.items())


def prompts_for(sla: Sla, n: int) -> list[str]:
    """The dataset's first ``n`` prompts when the workload has a dataset, else built-in
    (also when the dataset cannot be read here: the gate must not end a finished study)."""
    w = sla.workload
    if w.dataset is not None:
        try:
            _, rows = read_dataset(sla.resolve_path(w.dataset), w.dataset_format)
        except (DataFileError, ValueError, OSError):
            rows = ()
        records = [
            {"prompt": r.prompt}
            if r.prompt is not None
            else {"messages": [{"role": role, "content": text} for role, text in r.messages]}
            for r in rows
        ]
        found = dataset_prompts(records, n)
        if found:
            return found
    return builtin_prompts(n)


async def sample(
    base_url: str, model: str, prompts: Sequence[str], spec: QualitySpec
) -> list[Completion]:
    """Greedy completions with top log-probabilities, one request at a time."""
    out = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for prompt in prompts:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": spec.max_tokens,
                "temperature": 0,
                "logprobs": spec.top_logprobs,
            }
            async with session.post(f"{base_url}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    raise RuntimeError(f"completions answered HTTP {resp.status}: {text}")
                data = await resp.json()
            out.append(Completion.from_choice(data["choices"][0]))
    return out


async def _completions(
    sla: Sla,
    engine: EngineAdapter,
    python: Path,
    model_dir: Path,
    params: Mapping[str, ParamValue],
    prompts: Sequence[str],
    run_dir: Path,
    cuda_devices: list[str] | None,
    repeats: int = 1,
) -> list[list[Completion]]:
    """``repeats`` rounds of the prompts on one launch of ``params``."""
    process = make_engine(
        sla, python, model_dir, params, run_dir / "engine.log", cuda_devices, engine=engine
    )
    try:
        endpoint = await process.launch()
        spec = quality_of(sla)
        return [
            await sample(endpoint.base_url, endpoint.model, prompts, spec) for _ in range(repeats)
        ]
    finally:
        await process.stop()


def run_gate(
    sla: Sla,
    *,
    engine: EngineAdapter,
    python: Path,
    model_dir: Path,
    baseline: Mapping[str, ParamValue],
    candidate: Mapping[str, ParamValue],
    run_dir: Path,
    cuda_devices: list[str] | None = None,
    candidate_model_dir: Path | None = None,
    say: Say = print,
) -> GateResult:
    """The gate's verdict on ``candidate`` against ``baseline`` (two launches; none on random
    weights). ``candidate_model_dir``: the candidate serves another checkpoint of the model
    (e.g. a quantized copy). ``engine``: the adapter of the SLA's engine kind. Writes
    ``quality.json`` into ``run_dir``."""
    spec = quality_of(sla)
    cand_dir = candidate_model_dir or model_dir
    base_params = engine_params(sla, model_dir, baseline, engine=engine)
    cand_params = engine_params(sla, cand_dir, candidate, engine=engine)
    dummy = random_weights(engine, model_dir, base_params)
    if dummy or random_weights(engine, cand_dir, cand_params):
        result = unmeasurable(DUMMY_WEIGHTS, spec.limits)
        say(f"quality gate: {result.reason}")
        return result
    prompts = prompts_for(sla, spec.prompts)
    say(
        f"quality gate: {len(prompts)} prompts, {spec.max_tokens} greedy tokens each, "
        "baseline then candidate"
    )
    got: dict[str, list[list[Completion]]] = {}
    runs = (("baseline", model_dir, base_params, 2), ("candidate", cand_dir, cand_params, 1))
    for name, d, p, repeats in runs:
        try:
            got[name] = asyncio.run(
                _completions(
                    sla, engine, python, d, p, prompts, run_dir / name, cuda_devices, repeats
                )
            )
        except (EngineLaunchError, RuntimeError, aiohttp.ClientError, KeyError) as exc:
            result = unmeasurable(f"the {name} could not be sampled: {exc}", spec.limits)
            say(f"quality gate: {result.reason}")
            return result
    base, again = got["baseline"]
    # The baseline against itself: what differs between two identical runs is not the
    # candidate's doing (the gate's noise floor; 100 % on a deterministic engine).
    result = judge(compare(base, got["candidate"][0]), spec.limits, repeat=compare(base, again))
    _write(run_dir / "quality.json", result, prompts, base, got["candidate"][0])
    say(f"quality gate: {result.verdict}: {result.reason}")
    return result


def _write(
    path: Path,
    result: GateResult,
    prompts: Sequence[str],
    base: Sequence[Completion],
    cand: Sequence[Completion],
) -> None:
    rows: list[dict[str, Any]] = [
        {
            "prompt": p,
            "baseline": "".join(b.tokens),
            "candidate": "".join(c.tokens),
        }
        for p, b, c in zip(prompts, base, cand, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"result": result.to_dict(), "prompts": rows}, indent=2))
