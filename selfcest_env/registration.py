"""Registered environment ids and the factories behind them.

* ``SelfCest-Math-v0``: built-in arithmetic by default; ``source=`` picks another math source
  of the task-source registry (:mod:`selfcest_env.tasks.registry`).
* ``SelfCest-MultiHopQA-v0``: built-in synthetic multi-hop QA by default; ``source=`` picks
  another QA source of the registry (a dataset loader).

Keyword arguments are routed by name: :class:`~selfcest_env.config.EnvConfig` fields (``split``,
``root_view``, ...), :class:`~selfcest_env.budget.Limits` fields (``max_depth``,
``gen_budget``, ...), ``tokenizer``, and everything else to the task source. A source whose
instances depend on token counts (``takes_token_counter``: the synthetic QA generator) also gets
``token_counter=``, the env's own counter: the model's tokenizer when one is given, else the
offline counter.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import gymnasium as gym

from selfcest_env.budget import Limits
from selfcest_env.config import EnvConfig, split_env_kwargs
from selfcest_env.env import SelfCestEnv
from selfcest_env.tasks.registry import source_class
from selfcest_env.tokens import as_token_counter

MATH_ENV_ID = "SelfCest-Math-v0"
QA_ENV_ID = "SelfCest-MultiHopQA-v0"

#: The registered ids, each with its domain and default task source.
ENVS: dict[str, tuple[str, str]] = {
    MATH_ENV_ID: ("math", "arithmetic"),
    QA_ENV_ID: ("qa", "synthetic"),
}


def make_env(
    env_id: str,
    *,
    source: str | None = None,
    config: EnvConfig | None = None,
    tokenizer: Any | None = None,
    render_mode: str | None = None,
    **kwargs: Any,
) -> SelfCestEnv:
    """The environment of a registered id, without Gymnasium's wrappers, so that its batch API
    (:meth:`~SelfCestEnv.runnable`, :meth:`~SelfCestEnv.step_many`) is at hand: what drivers
    and trainers build. ``gym.make(env_id, **kwargs)`` builds the same env, wrapped.

    ``source`` picks a task source of the env's domain (default: the env's own); the other
    keywords are routed by name (see the module docstring).

    Raises:
        ValueError: ``env_id`` is not a SelfCest id, or ``source`` is unknown (the message
            lists the valid ones).
    """
    if env_id not in ENVS:
        raise ValueError(f"unknown env id {env_id!r}; valid ids: {', '.join(ENVS)}")
    domain, default_source = ENVS[env_id]
    return _make_env(domain, source or default_source, config, tokenizer, render_mode, kwargs)


def make_math_env(**kwargs: Any) -> SelfCestEnv:
    """The entry point of ``SelfCest-Math-v0`` (:func:`make_env` of that id)."""
    return make_env(MATH_ENV_ID, **kwargs)


def make_qa_env(**kwargs: Any) -> SelfCestEnv:
    """The entry point of ``SelfCest-MultiHopQA-v0`` (:func:`make_env` of that id)."""
    return make_env(QA_ENV_ID, **kwargs)


def _make_env(
    domain: str,
    source: str,
    config: EnvConfig | None,
    tokenizer: Any | None,
    render_mode: str | None,
    kwargs: dict[str, Any],
) -> SelfCestEnv:
    env_config, source_kwargs = split_env_kwargs(kwargs, config)
    source_cls = source_class(source, domain)
    counter = as_token_counter(tokenizer)
    counting = {"token_counter": counter} if source_cls.takes_token_counter else {}
    try:
        task = source_cls(**{**counting, **source_kwargs})
    except TypeError as exc:
        if not source_kwargs:
            raise
        raise TypeError(
            f"{exc} (arguments that are not env settings or limits go to source {source!r}; "
            f"env settings: {', '.join(f.name for f in fields(EnvConfig))}; limits: "
            f"{', '.join(f.name for f in fields(Limits))})"
        ) from exc
    return SelfCestEnv(task, env_config, counter, render_mode)


def register_envs() -> None:
    """Register the SelfCest ids with Gymnasium (idempotent)."""
    for env_id, entry_point in (
        (MATH_ENV_ID, "selfcest_env.registration:make_math_env"),
        (QA_ENV_ID, "selfcest_env.registration:make_qa_env"),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)
