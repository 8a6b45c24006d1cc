#!/usr/bin/env bash
# autotuner 0.1.0: promoted config of study llama3-8b-h200-quick
# engine vllm 0.26.0
#
# --load-format dummy: random weights, as benchmarked. For benchmarking only: remove it
# to serve the model's real weights (same speed, real answers).
set -euo pipefail
exec vllm serve /tmp/athome/models/llama-3.1-8b \
  --served-model-name llama-3.1-8b \
  --host 127.0.0.1 \
  --port 8000 \
  --load-format dummy \
  "$@"
