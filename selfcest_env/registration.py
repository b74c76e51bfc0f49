"""Registered environment ids and the factories behind them.

* ``SelfCest-Math-v0``: built-in arithmetic by default; ``source=`` picks another math source
  (see :func:`selfcest_env.tasks.math.make_math_source`).
* ``SelfCest-MultiHopQA-v0``: built-in synthetic multi-hop QA by default; ``source=`` picks a
  dataset loader (see :func:`selfcest_env.tasks.qa.make_qa_source`).

Keyword arguments are routed by name: :class:`~selfcest_env.env.EnvConfig` fields (``split``,
``root_view``, ...), :class:`~selfcest_env.budget.Limits` fields (``max_depth``,
``gen_budget``, ...), ``tokenizer``, and everything else to the task source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import gymnasium as gym

from selfcest_env.budget import Limits
from selfcest_env.env import EnvConfig, SelfCestEnv, split_env_kwargs
from selfcest_env.tasks.base import TaskSource

MATH_ENV_ID = "SelfCest-Math-v0"
QA_ENV_ID = "SelfCest-MultiHopQA-v0"


def make_math_env(
    source: str = "arithmetic",
    *,
    config: EnvConfig | None = None,
    tokenizer: Any | None = None,
    render_mode: str | None = None,
    **kwargs: Any,
) -> SelfCestEnv:
    """A :class:`SelfCestEnv` over a math source (the entry point of ``SelfCest-Math-v0``)."""
    from selfcest_env.tasks.math import make_math_source

    return _make_env(make_math_source, source, config, tokenizer, render_mode, kwargs)


def make_qa_env(
    source: str = "synthetic",
    *,
    config: EnvConfig | None = None,
    tokenizer: Any | None = None,
    render_mode: str | None = None,
    **kwargs: Any,
) -> SelfCestEnv:
    """A :class:`SelfCestEnv` over a QA source (the entry point of ``SelfCest-MultiHopQA-v0``)."""
    from selfcest_env.tasks.qa import make_qa_source

    return _make_env(make_qa_source, source, config, tokenizer, render_mode, kwargs)


def _make_env(
    make_source: Callable[..., TaskSource],
    source: str,
    config: EnvConfig | None,
    tokenizer: Any | None,
    render_mode: str | None,
    kwargs: dict[str, Any],
) -> SelfCestEnv:
    env_config, source_kwargs = split_env_kwargs(kwargs, config)
    try:
        task = make_source(source, **source_kwargs)
    except TypeError as exc:
        if not source_kwargs:
            raise
        raise TypeError(
            f"{exc} (arguments that are not env settings or limits go to source {source!r}; "
            f"env settings: {', '.join(f.name for f in fields(EnvConfig))}; limits: "
            f"{', '.join(f.name for f in fields(Limits))})"
        ) from exc
    return SelfCestEnv(task, env_config, tokenizer, render_mode)


def register_envs() -> None:
    """Register the SelfCest ids with Gymnasium (idempotent)."""
    for env_id, entry_point in (
        (MATH_ENV_ID, "selfcest_env.registration:make_math_env"),
        (QA_ENV_ID, "selfcest_env.registration:make_qa_env"),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)
