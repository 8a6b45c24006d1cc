"""How fast the load generator can send: the ceiling behind the SLA's bound on ``rate``.

Starts a stand-in server (``autotuner.testing.standin``) in its own process that answers at once
(no prefill, no token interval, one output token), sends ``--requests`` requests through the
load generator (:func:`autotuner.measure.loadgen.run_load`) at ``--rate`` (default: all due at
once) and prints the send rate it reached, its CPU time per request and its peak RSS. On the
project's 2-core host: 460-540 us of CPU per request, 1,000-3,200 sends/s; the bound
(``MAX_RATE`` in ``autotuner/sla/bounds.py``, 100,000 req/s: 10 us per request) is 50x
above that. Run::

    python3 benchmarks/loadgen_ceiling.py --requests 5000
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import subprocess
import sys
import time
import urllib.request

from autotuner.measure.loadgen import LoadPlan, run_load
from autotuner.workload.requests import Arrival, LengthDist, PromptSource, RequestFactory

FAST = ("--ttft-s", "0", "--itl-s", "0")  # the stand-in answers at once


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_healthy(url: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=1e9, help="req/s (default: all due at once)")
    args = ap.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "autotuner.testing.standin", "--port", str(port), *FAST],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_healthy(url)
        factory = RequestFactory(
            "completions",
            PromptSource(vocab_size=500, words=("a", "b", "c")),
            LengthDist.fixed(16),
            LengthDist.fixed(1),
            seed=0,
        )
        plan = LoadPlan(
            api="completions",
            factory=factory,
            arrival=Arrival("constant", rate=args.rate),
            requests=args.requests,
            duration_s=None,
            request_timeout_s=60.0,
        )
        cpu = time.process_time()
        result = asyncio.run(run_load(url, "standin-model", plan))
        cpu = time.process_time() - cpu
    finally:
        server.terminate()
        server.wait()
    sent = sorted(r.sent_s for r in result.records)
    span = max(sent[-1] - sent[0], 1e-9)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.requests} requests, {len(result.ok)} ok, errors {result.errors() or 'none'}: "
        f"sent at {args.requests / span:,.0f} req/s, {cpu / args.requests * 1e6:,.0f} us of CPU "
        f"per request, peak RSS {rss:,.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
