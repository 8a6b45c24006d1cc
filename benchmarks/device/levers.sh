#!/usr/bin/env bash
# Which engine settings move a limit at one load: each config measured once, at the SLA's own
# rate, by `autotuner bench` (one launch, one level, the SLA's workload and warm-up). On the GPU
# machine, detached like study.sh (a call is at most 10 minutes; the run outlives it).
#
#   bash benchmarks/device/levers.sh start SLA.yaml OUT_DIR CONFIGS_FILE   # vLLM in /tmp/site
#   bash benchmarks/device/levers.sh follow OUT_DIR [SECONDS]
#
# CONFIGS_FILE: one config a line, a name then `--set NAME=VALUE` words ("defaults" with none),
# e.g. `mnbt-2048 --set max_num_batched_tokens=2048`. Each config's `bench -o` JSON and log land
# in OUT_DIR; `follow` prints each finished config's p99 TPOT and TTFT and copies OUT_DIR to $OUT.
# Expects the tuner's dependency wheels in .wheels/ (docs/benchmarks/h200-llama3-8b.md).
set -euo pipefail
mode=${1:?start or follow}
export PYTHONPATH=/tmp/at-site:$PWD AUTOTUNER_VLLM_PYTHON=/tmp/vpy AUTOTUNER_HOME=/tmp/athome
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
case "$mode" in
start)
    sla=${2:?SLA file}
    out=${3:?output folder}
    configs=${4:?configs file}
    if [ ! -d /tmp/at-site ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/at-site .wheels/*.whl
    fi
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/vpy && chmod +x /tmp/vpy
    mkdir -p "$out"
    # Each line's words are passed as arguments, never through a shell.
    setsid nohup python3 benchmarks/device/levers_run.py "$sla" "$out" "$configs" \
        > "$out/run.log" 2>&1 < /dev/null &
    echo "started: pid $!"
    ;;
follow)
    out=${2:?output folder}
    limit=${3:-520}
    while pgrep -f levers_run.py > /dev/null && [ "$SECONDS" -lt "$limit" ]; do sleep 10; done
    if pgrep -f levers_run.py > /dev/null; then echo "still running"; else echo "finished"; fi
    tail -30 "$out/run.log"
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader || true
    if [ -n "${OUT:-}" ]; then tar czf "$OUT/$(basename "$out").tar.gz" -C "$(dirname "$out")" "$(basename "$out")"; fi
    ;;
*) echo "usage: levers.sh start SLA OUT_DIR CONFIGS | follow OUT_DIR [SECONDS]" >&2; exit 2 ;;
esac
