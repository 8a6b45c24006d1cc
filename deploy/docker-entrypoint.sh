#!/bin/sh
# Registers the image's vLLM as the engine environment "vllm", then runs the daemon with
# the container's arguments. The registry lives in the state volume, which hides anything
# written at build time, so this runs at every start; --replace also follows a new image
# whose interpreter moved.
set -eu

engine_name="${AUTOTUNER_ENGINE_NAME:-vllm}"
engine_python="${AUTOTUNER_ENGINE_PYTHON:-$(command -v python3)}"

autotuner engine add "$engine_name" --python "$engine_python" --replace
exec autotuner daemon "$@"
