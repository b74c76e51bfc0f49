#!/usr/bin/env bash
# Plays the fork-against-fresh demo into this folder and writes its leaderboard: the laptop
# model trained in ThreadWeaver's fork grammar (selfcest train --recipe laptop-fork) and in
# SELFCEST's fresh-clone protocol (--recipe laptop-fresh), on the recipes' task and limits, 256
# greedy test episodes each, then the CSV and its plots. Run from the repository root after
# training both recipes; rerunning resumes (nothing is played twice).
set -euo pipefail
out=leaderboards/fork-vs-fresh
task=(--env-arg min_operators=9 --env-arg max_operators=9 --env-arg min_operand_digits=1
  --env-arg max_operand_digits=1 --env-arg 'operator_weights={"+": 1}'
  --env-arg paren_probability=0 --env-arg spaced=false --env-arg context_window=192
  --env-arg 'prompts={"root_system": "Delegate.", "plain_system": "Solve.",
    "clone_system": "Solve.", "clone_spawn_note": "Delegate."}'
  --max-new-tokens 48 --episodes 256 --out "$out" --no-progress)
# (the fork grammar's root reads the task alone: the recipes' prompts only reach fresh clones)
selfcest run --agents threadweaver --model runs/train-laptop-fork/final "${task[@]}"
selfcest run --agents clone-controller,monolithic --model runs/train-laptop-fresh/final "${task[@]}"
selfcest leaderboard "$out"
selfcest plot "$out/leaderboard.csv" --out "$out/plots"
