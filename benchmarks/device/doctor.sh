#!/usr/bin/env bash
# `autotuner doctor` on the GPU machine: the checks of an SLA (default: the H200 one), as text
# on stdout and as JSON in $OUT/doctor.json (or ./doctor.json), then the exit code (0 ok,
# 1 warnings, 2 a launch would fail).
#
#   bash benchmarks/device/doctor.sh [SLA.yaml]
#
# The engine interpreter is the SLA's engine.python (/opt/vllm/bin/python in
# objectives/llama3-8b-h200.yaml) unless AUTOTUNER_VLLM_PYTHON names another, e.g. the /tmp/vpy
# wrapper of study.sh around vLLM in /tmp/site (../shared/device/README.md). The tuner's own
# dependencies come from `pip install -e .`, or from the wheels in .wheels/ installed to
# /tmp/at-site as study.sh does. Without pynvml in the tuner's Python the GPU facts come from
# nvidia-smi. Nothing is launched; it takes seconds (torch's import in the engine's Python).
set -uo pipefail
sla=${1:-objectives/llama3-8b-h200.yaml}
out=${OUT:-.}
if ! python3 -c "import optuna, pydantic" 2> /dev/null; then
    if [ ! -d /tmp/at-site ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/at-site .wheels/*.whl
    fi
    export PYTHONPATH=/tmp/at-site:$PWD
fi
python3 -m autotuner doctor "$sla"
rc=$?
python3 -m autotuner doctor "$sla" --json > "$out/doctor.json"
echo "exit $rc (report: $out/doctor.json)"
exit "$rc"
