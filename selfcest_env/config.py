"""How an environment is configured: :class:`EnvConfig`, and ``gym.make`` keywords routed to it.

``gym.make("SelfCest-Math-v0", max_depth=2, split="dev", preset="easy")`` sets a limit, a config
field and a task-source parameter in one call: :func:`split_env_kwargs` routes each keyword by
name to :class:`EnvConfig`, its :class:`~selfcest_env.budget.Limits`, or the task source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from selfcest_env.budget import Limits
from selfcest_env.configfile import from_mapping
from selfcest_env.grammars import grammar_names
from selfcest_env.prompts import PromptConfig
from selfcest_env.protocol import SPAWN_MODES
from selfcest_env.reward import RewardConfig
from selfcest_env.tasks.base import check_split

RootView = Literal["keys", "full"]
SpawnMode = Literal["fresh", "fork"]


@dataclass(frozen=True)
class EnvConfig:
    """Everything that shapes an episode besides the task source.

    Attributes:
        limits: Token and count limits (:class:`~selfcest_env.budget.Limits`).
        reward: Reward constants; ``None`` picks the reference rule for the task's domain.
        prompts: Prompt wording and answer truncation.
        split: Task split episodes are drawn from (``train``, ``dev`` or ``test``).
        root_view: QA only: ``"keys"`` shows the root the paragraph titles, ``"full"`` the
            paragraphs themselves.
        reveal_answer: Put the gold answer into the final ``info`` (off, so that agents cannot
            read labels by accident).
        max_prompt_chars: Upper bound of the prompt and action text spaces (characters; a
            million by default, far above what a model's window holds). A context whose prompt
            would grow past it fails with ``context limit``, and its turns are cut to the room
            left. ``AsyncVectorEnv``'s shared memory reserves 4 bytes per character per env.
        grade_timeout_s: Seconds the task's grader may take before the answer scores 0 with the
            reason in ``info["grade_error"]`` (``None``: no limit); see
            :mod:`selfcest_env.safe_grading`. Generous by default: the math grader's first call
            starts a worker process.
        spawn_mode: How clones start when a spawn does not say (:data:`~selfcest_env.protocol.
            SPAWN_MODES`): ``fresh`` (its objective and the context keys it is given) or
            ``fork`` (a copy of its parent's context so far, then its objective).
        protocol: The grammar text turns are read in (:mod:`selfcest_env.grammars`):
            ``tool-call`` (SELFCEST's ``spawn_clone`` calls), or a single-stream parallel
            grammar (``apr``, ``threadweaver``, ``parallel-r1``, ``multiverse``) for scoring
            models trained in another method's format on the same ledger.
    """

    limits: Limits = field(default_factory=Limits)
    reward: RewardConfig | None = None
    prompts: PromptConfig = field(default_factory=PromptConfig)
    split: str = "test"
    root_view: RootView = "keys"
    reveal_answer: bool = False
    max_prompt_chars: int = 1 << 20
    grade_timeout_s: float | None = 300.0
    spawn_mode: SpawnMode = "fresh"
    protocol: str = "tool-call"

    def __post_init__(self) -> None:
        check_split(self.split)
        if self.protocol not in grammar_names():
            raise ValueError(
                f"protocol must be one of {', '.join(grammar_names())}, got {self.protocol!r}"
            )
        if self.spawn_mode not in SPAWN_MODES:
            raise ValueError(
                f"spawn_mode must be one of {', '.join(SPAWN_MODES)}, got {self.spawn_mode!r}"
            )
        if self.root_view not in ("keys", "full"):
            raise ValueError(f"root_view must be 'keys' or 'full', got {self.root_view!r}")
        timeout = self.grade_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise ValueError(f"grade_timeout_s must be a positive number or None, got {timeout!r}")


_CONFIG_FIELDS = {f.name for f in fields(EnvConfig)}
_LIMIT_FIELDS = {f.name for f in fields(Limits)}


def split_env_kwargs(
    kwargs: Mapping[str, Any], config: EnvConfig | None = None
) -> tuple[EnvConfig, dict[str, Any]]:
    """Route keyword arguments to :class:`EnvConfig`, :class:`Limits` or the task source.

    ``gym.make("SelfCest-Math-v0", max_depth=2, split="dev", preset="easy")`` sets a limit,
    a config field and a source argument in one call. ``reward`` may be a mapping of
    :class:`~selfcest_env.reward.RewardConfig`'s fields (``{"tool_call_coef": 0.1,
    "root_penalty": {"threshold": 64, "ramp": 64, "maximum": 0.3}}``), as config files write it.
    """
    config = config or EnvConfig()
    config_updates = {k: v for k, v in kwargs.items() if k in _CONFIG_FIELDS}
    if isinstance(config_updates.get("reward"), Mapping):  # from a config file or the CLI
        config_updates["reward"] = from_mapping(RewardConfig, config_updates["reward"], "reward")
    if isinstance(config_updates.get("prompts"), Mapping):
        config_updates["prompts"] = from_mapping(PromptConfig, config_updates["prompts"], "prompts")
    limit_updates = {k: v for k, v in kwargs.items() if k in _LIMIT_FIELDS}
    source_kwargs = {
        k: v for k, v in kwargs.items() if k not in _CONFIG_FIELDS and k not in _LIMIT_FIELDS
    }
    if limit_updates:
        base = config_updates.get("limits", config.limits)
        config_updates["limits"] = replace(base, **limit_updates)
    return replace(config, **config_updates), source_kwargs
