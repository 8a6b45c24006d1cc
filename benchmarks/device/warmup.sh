#!/usr/bin/env bash
# The cold-engine benchmark (benchmarks/warmup.py) on the GPU machine, in one call.
#
#   bash benchmarks/device/warmup.sh SLA.yaml NAME LEVELS [--set K=V ...] [NAME LEVELS ...]
#
# Each NAME LEVELS pair is one fresh engine (its own launch) with the load levels LEVELS
# (rate:requests,...), run one after the other; `--set K=V` after a pair sets an engine
# parameter for that launch only (a candidate's config beside the defaults). The first launch
# on a fresh machine has cold compile caches (~/.cache/vllm), later ones warm caches. Each launch's folder (requests.csv,
# windows.csv, summary.txt, result.json, engine.log) and its output go to $OUT/NAME.tar.gz as
# soon as it ends, so a call stopped at its time limit still brings back the finished ones.
# A launch starts only while less than SKIP_AFTER seconds (default 330) of the call have passed.
#
# Expects vLLM 0.26.0 in /tmp/site (../shared/device/README.md): the tuner runs with the
# system python3 and /tmp/site on its path (vLLM's dependencies include the tuner's: aiohttp,
# pydantic, psutil, numpy, pyyaml, prometheus-client), the engine through /tmp/vpy.
set -uo pipefail
sla=${1:?SLA file}
shift
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/vpy && chmod +x /tmp/vpy
export PYTHONPATH=$PWD:/tmp/site AUTOTUNER_VLLM_PYTHON=/tmp/vpy AUTOTUNER_HOME=/tmp/athome
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/warmup-out}
mkdir -p /tmp/warmup "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
while [ $# -ge 2 ]; do
    name=$1 levels=$2
    shift 2
    sets=()
    while [ "${1:-}" = --set ] && [ $# -ge 2 ]; do sets+=(--set "$2"); shift 2; done
    if [ "$SECONDS" -ge "${SKIP_AFTER:-330}" ]; then
        echo "skipping $name: $SECONDS s of the call have passed"
        continue
    fi
    echo "=== $name: levels $levels ${sets[*]} (at $SECONDS s)"
    python3 benchmarks/warmup.py "$sla" --levels "$levels" "${sets[@]}" --out "/tmp/warmup/$name" 2>&1 \
        | tee "/tmp/warmup/$name.log"
    cp "/tmp/warmup/$name.log" "/tmp/warmup/$name/output.log" 2>/dev/null || true
    tar czf "$out/$name.tar.gz" -C /tmp/warmup "$name"
done
echo "done at $SECONDS s"
