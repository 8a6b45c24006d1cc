"""Bounds of the SLA's numbers, checked when it is read."""

from __future__ import annotations

# Bounds that no real SLA reaches, so that a typo (or hostile input) fails here and not as a
# hang or an overflow in the middle of a run.
MAX_SLA_BYTES = 1 << 20  # an SLA file is a page of YAML; /dev/zero is not one
MAX_TOKENS = 10_000_000
MAX_SECONDS = 7 * 24 * 3600.0
MAX_REQUESTS = 10_000_000

# What one launch may cost, checked before anything runs (objectives/README.md, "Bounds"). A
# load level sends its requests within MAX_LEVEL_S (its planned duration, see
# ``autotuner.sla.document``; the first level, at the SLA's own rate, is the longest) and keeps
# at most MAX_LEVEL_REQUESTS requests with their timings in memory.
MAX_LEVEL_S = 3600.0
MAX_LEVEL_REQUESTS = 100_000
MAX_WARMUP_REQUESTS = 1_000
MAX_CONCURRENCY = 10_000  # a closed loop's requests in flight: a task and a connection each
MIN_RATE = 0.001  # req/s, and a trace's replay speed: a level's duration divides by it
# The most req/s an open loop may be scheduled at. The load generator is one Python process,
# and every request costs it a task, a new connection, the request and the parsing of its
# streamed answer: about 540 us of CPU per request on this project's 2-core CI host, so it
# sends at most ~2,000 req/s there (benchmarks/loadgen_ceiling.py). 10 us per request, 50x
# less than that, is more than any host's core sends: a higher rate is only ever scheduled,
# never offered to the engine (1e8 req/s passed once and flooded the host with send tasks).
MAX_RATE = 100_000.0
MAX_REQUEST_TIMEOUT_S = 3600.0  # also the longest a level waits for its last requests
MAX_STARTUP_S = 6 * 3600.0  # an engine start that never answers holds its devices this long
MAX_TURNS = 1_000  # turns of one conversation, each resending the whole history
MAX_GRID_POINTS = 10_000  # launches of a grid study; Optuna lists every point in memory
