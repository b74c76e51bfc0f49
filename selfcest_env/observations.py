"""What an agent sees of a context: the observation (a ``spaces.Dict``) and the info dict."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from selfcest_env.budget import Limits
from selfcest_env.prompts import render_messages, spawn_clone_schema
from selfcest_env.tree import Context


def budgets(
    context: Context, allowance: int | None, remaining_gen_tokens: int, limits: Limits
) -> dict[str, float]:
    """The budget entries of a context's observation (``inf`` where unlimited)."""
    window, turns = limits.context_window, limits.max_turns
    return {
        "max_new_tokens": math.inf if allowance is None else float(allowance),
        "remaining_gen_tokens": float(remaining_gen_tokens),
        "remaining_context_tokens": (
            math.inf if window is None else float(max(0, window - context.length))
        ),
        "remaining_turns": math.inf if turns is None else float(turns - len(context.turns)),
    }


def observation(
    context: Context,
    allowance: int | None,
    remaining_gen_tokens: int,
    limits: Limits,
    max_prompt_chars: int,
) -> dict[str, Any]:
    """The observation of ``context``: its id, depth, rendered prompt and budgets.

    A context whose prompt is longer than ``max_prompt_chars`` never acts (it fails with
    ``context limit``); where it is still observed (the root at the end of an episode, or at a
    reset whose first step ends it) the prompt shows its first ``max_prompt_chars`` characters.
    """
    obs: dict[str, Any] = {
        "context_id": np.array(context.id, dtype=np.int64),
        "depth": np.array(context.depth, dtype=np.int64),
        "prompt": render_messages(context.messages)[:max_prompt_chars],
    }
    for key, value in budgets(context, allowance, remaining_gen_tokens, limits).items():
        obs[key] = np.array(value, dtype=np.float64)
    return obs


def context_info(
    context: Context,
    allowance: int | None,
    answer_type: str,
    context_keys: list[str],
    uses_tools: bool = True,
) -> dict[str, Any]:
    """The info of ``context`` (the env adds ``meters`` and ``runnable``): its chat messages,
    the tool schema when it may spawn, what it may generate now, how answers are read."""
    return {
        "context_id": context.id,
        "depth": context.depth,
        "label": context.label,
        "turn": len(context.turns) + 1,
        "messages": [dict(m) for m in context.messages],
        "objective": context.objective,
        "context_keys": context_keys if context.may_spawn else [],
        "answer_type": answer_type,
        "tools": [spawn_clone_schema()] if context.may_spawn and uses_tools else [],
        "max_new_tokens": allowance,
    }
