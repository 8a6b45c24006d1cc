#!/usr/bin/env bash
# Serves 'llama-3.1-8b' on http://127.0.0.1:8000/v1 (OpenAI API).
#
# Inside the container the server listens on 0.0.0.0 so that Docker's port forward
# reaches it; the port is published on the host's 127.0.0.1 only, so nothing outside
# this machine can connect. Put an authenticating TLS proxy in front to expose it.
#
# --load-format dummy: random weights, as benchmarked. For benchmarking only: remove it
# to serve the model's real weights (same speed, real answers).
set -euo pipefail
exec docker run --rm \
  --gpus '"device=GPU-209d824b-d3cb-2590-bd57-8e49e31f4abf"' \
  --shm-size 16g \
  --user 1000:1000 \
  --cap-drop ALL \
  --security-opt no-new-privileges \
  -p 127.0.0.1:8000:8000 \
  -v /tmp/athome/models/llama-3.1-8b:/model:ro \
  -e HOME=/tmp \
  -e HF_HUB_OFFLINE=1 \
  vllm/vllm-openai:v0.26.0 \
  --model /model \
  --served-model-name llama-3.1-8b \
  --host 0.0.0.0 \
  --port 8000 \
  --load-format dummy
