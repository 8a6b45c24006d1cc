#!/usr/bin/env bash
# A tune on the GPU machine in pieces: `start` launches it detached, `follow` waits for it.
#
# The GPU machine is held for calls of at most 10 minutes and comes back bare after a gap, so
# a study runs detached (it outlives the call) and each following call waits up to ~9 minutes,
# prints progress and leaves the study directory as a tarball in $OUT. The study resumes from
# that tarball on a fresh machine: finished launches are never repeated.
#
#   bash benchmarks/device/study.sh start SLA.yaml [STUDY_TARBALL]   # vLLM already in /tmp/site
#   bash benchmarks/device/study.sh follow STUDY_NAME [SECONDS]
#   bash benchmarks/device/study.sh stop STUDY_NAME [SECONDS]   # at the next launch's start
#
# `stop` ends a piece cleanly: it waits (up to SECONDS) for the launch in progress to finish,
# then sends SIGTERM (a tune started in the background ignores SIGINT), which stops the engine
# and re-queues the launch just begun, and leaves the study without its per-request level files.
# `follow` and `stop` find the tuner with `pgrep -f "autotuner tune"`: run them where it is the
# only tune, from a command line that does not itself contain those words.
#
# Expects vLLM 0.26.0 in /tmp/site (../shared/device/README.md) and the tuner's Python 3.12
# dependency wheels in .wheels/ (docs/benchmarks/h200-llama3-8b.md, "Commands").
set -euo pipefail
mode=${1:?start or follow}
export PYTHONPATH=/tmp/at-site:$PWD AUTOTUNER_VLLM_PYTHON=/tmp/vpy AUTOTUNER_HOME=/tmp/athome
export VLLM_USE_FLASHINFER_SAMPLER=0
case "$mode" in
start)
    sla=${2:?SLA file}
    if [ ! -d /tmp/at-site ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/at-site .wheels/*.whl
    fi
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/vpy && chmod +x /tmp/vpy
    mkdir -p trials
    if [ -n "${3:-}" ]; then tar xzf "$3" -C trials; fi
    setsid nohup python3 -m autotuner tune "$sla" > /tmp/tune.log 2>&1 < /dev/null &
    echo "started: pid $!"
    sleep 20
    tail -5 /tmp/tune.log
    ;;
follow)
    name=${2:?study name}
    limit=${3:-520}
    while pgrep -f "autotuner tune" > /dev/null && [ "$SECONDS" -lt "$limit" ]; do sleep 10; done
    if pgrep -f "autotuner tune" > /dev/null; then echo "still running"; else echo "finished"; fi
    tail -40 /tmp/tune.log
    nvidia-smi --query-gpu=memory.used --format=csv,noheader || true
    if [ -n "${OUT:-}" ] && [ -d "trials/$name" ]; then
        # Kernel-profile traces (hundreds of MiB) stay behind: the breakdown read from them is
        # in the study, and with them the tarball no longer came back from the machine.
        tar czf "$OUT/$name.tar.gz" --exclude=traces -C trials "$name"
        cp /tmp/tune.log "$OUT/tune.log"
        python3 -m autotuner report "$name" > "$OUT/report.txt" 2>&1 || true
    fi
    ;;
stop)
    name=${2:?study name}
    limit=${3:-300}
    seen=$(grep -c '^trial [0-9]* (' /tmp/tune.log || true)
    while pgrep -f "autotuner tune" > /dev/null && [ "$SECONDS" -lt "$limit" ] \
        && [ "$(grep -c '^trial [0-9]* (' /tmp/tune.log || true)" -le "$seen" ]; do sleep 5; done
    pkill -TERM -f "autotuner tune" || true
    while pgrep -f "autotuner tune" > /dev/null && [ "$SECONDS" -lt $((limit + 60)) ]; do sleep 1; done
    tail -8 /tmp/tune.log
    if [ -n "${OUT:-}" ] && [ -d "trials/$name" ]; then
        tar czf "$OUT/$name.tar.gz" --exclude='level-*.json' --exclude=tune.lock -C trials "$name"
        cp /tmp/tune.log "$OUT/tune.log"
    fi
    ;;
*) echo "usage: study.sh start SLA [TARBALL] | follow NAME [SECONDS] | stop NAME [SECONDS]" >&2; exit 2 ;;
esac
