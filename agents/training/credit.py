"""Credit assignment: one advantage per training sample, from the rewards of a batch of rollouts.

A batch holds ``n`` rollouts (episodes) of each task; rollouts of one task form a *group*.
Every rule starts from the GRPO advantage of each rollout's root:

    A(root_i) = (R_i - mean_g R) / (std_g R + eps)

over the root rewards ``R`` of the rollouts in its group ``g`` (``std`` is the population
standard deviation; ``normalize_std=False`` drops the division, as in Dr. GRPO). A group whose
rewards are all equal gives every root advantage 0. The rules differ in what clones get:

``reference`` (the SELFCEST rule)
    a clone ``c`` of rollout ``i`` gets ``A(root_i) * clip(r_c / d_i, -ratio_clip, ratio_clip)``
    with its context reward ``r_c``, ``ratio_clip = 1.5`` and the sign-safe denominator
    ``d_i = sign(R_i) * max(|R_i|, eps)`` (``sign(0) = +1``): a zero root reward never divides
    by zero, and a negative one keeps its sign. With the env's default clone reward
    ``R_i / 2.5`` every clone of a rollout gets 0.4 of its root's advantage.

``shared`` (APR's rule)
    every context of rollout ``i`` gets ``A(root_i)``: one outcome for the whole tree.

``difference`` (a per-context difference reward)
    each context is compared with its *peers*: the contexts of the same group at the same depth
    (roots with the group's roots, clones with all clones that the group's rollouts started).
    ``A(c) = (r_c - mean_{p in peers, p != c} r_p) / (std_{peers} r + eps)``: the context's own
    reward minus the leave-one-out mean of its peers' rewards, i.e. what this context's
    behaviour gained over what a peer's behaviour gets in its place (the "default action" of a
    difference reward, estimated from the group instead of a second rollout). For roots it is
    the RLOO advantage. A context without peers gets 0. Unlike ``reference``, clones of a failed
    rollout are pushed down (their reward is below their peers').

The advantage is per sample (one context, or one turn) and is applied to every trainable token
of it. A rule is a function ``(samples, config, root_rewards, groups) -> advantages`` (see
:data:`CreditRule`) registered by name: the bundled ones in :data:`CREDIT_RULES`, others
through the entry-point group ``selfcest.credit_rules`` (see :mod:`selfcest_env.plugins`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from selfcest_env.agents.training.samples import Sample
from selfcest_env.plugins import Registry

#: The bundled rules: name -> ``"module:function"``, in the order the docs list them.
CREDIT_RULES: dict[str, str] = {
    "reference": "selfcest_env.agents.training.credit:reference_rule",
    "shared": "selfcest_env.agents.training.credit:shared_rule",
    "difference": "selfcest_env.agents.training.credit:difference_rule",
}

REGISTRY = Registry(
    kind="credit rule",
    group="selfcest.credit_rules",
    table=CREDIT_RULES,
    expected="a function (samples, config, root_rewards, groups) -> advantages",
    accepts=callable,
)


@dataclass(frozen=True)
class CreditConfig:
    """How advantages are computed (see the module docstring).

    Attributes:
        rule: A credit rule name (:func:`credit_rule_names`: reference, shared, difference).
        ratio_clip: Bound of the clone-to-root reward ratio of the reference rule.
        normalize_std: Divide by the group's standard deviation.
        eps: Added to standard deviations; the smallest magnitude of a ratio's denominator.
    """

    rule: str = "reference"
    ratio_clip: float = 1.5
    normalize_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        credit_rule(self.rule)
        if self.ratio_clip <= 0 or self.eps <= 0:
            raise ValueError("ratio_clip and eps must be positive")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    mean = _mean(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def root_advantages(
    root_rewards: Mapping[int, float], groups: Mapping[int, int], config: CreditConfig
) -> dict[int, float]:
    """GRPO advantage of each rollout's root: ``{episode: advantage}``.

    Args:
        root_rewards: ``{episode: root reward}`` for every rollout of the batch (also those
            without a trainable sample: they still shape their group's baseline).
        groups: ``{episode: group}``.
    """
    members: dict[int, list[int]] = defaultdict(list)
    for episode in root_rewards:
        members[groups[episode]].append(episode)
    advantages = {}
    for episodes in members.values():
        rewards = [root_rewards[e] for e in episodes]
        mean, std = _mean(rewards), _std(rewards)
        scale = std + config.eps if config.normalize_std else 1.0
        for episode in episodes:
            advantages[episode] = 0.0 if std == 0 else (root_rewards[episode] - mean) / scale
    return advantages


def _signed_denominator(value: float, eps: float) -> float:
    magnitude = max(abs(value), eps)
    return magnitude if value >= 0 else -magnitude


def difference_rule(
    samples: Sequence[Sample],
    config: CreditConfig,
    root_rewards: Mapping[int, float],
    groups: Mapping[int, int],
) -> list[float]:
    """The ``difference`` rule: each context against its peers (module docstring)."""
    # One reward per context, even when the per-turn form gives a context several samples.
    contexts: dict[tuple[int, int], Sample] = {}
    for sample in samples:
        contexts.setdefault((sample.episode, sample.context_id), sample)
    peers: dict[tuple[int, int], list[float]] = defaultdict(list)
    for sample in contexts.values():
        peers[(sample.group, sample.depth)].append(sample.reward)
    advantages = []
    for sample in samples:
        rewards = peers[(sample.group, sample.depth)]
        if len(rewards) < 2:
            advantages.append(0.0)
            continue
        others = (sum(rewards) - sample.reward) / (len(rewards) - 1)
        std = _std(rewards)
        scale = std + config.eps if config.normalize_std else 1.0
        advantages.append(0.0 if std == 0 else (sample.reward - others) / scale)
    return advantages


def shared_rule(
    samples: Sequence[Sample],
    config: CreditConfig,
    root_rewards: Mapping[int, float],
    groups: Mapping[int, int],
) -> list[float]:
    """The ``shared`` rule: every context gets its root's advantage."""
    roots = root_advantages(root_rewards, groups, config)
    return [roots[sample.episode] for sample in samples]


def reference_rule(
    samples: Sequence[Sample],
    config: CreditConfig,
    root_rewards: Mapping[int, float],
    groups: Mapping[int, int],
) -> list[float]:
    """The ``reference`` (SELFCEST) rule: a clone gets its root's advantage scaled by its
    clipped reward ratio."""
    roots = root_advantages(root_rewards, groups, config)
    advantages = []
    for sample in samples:
        advantage = roots[sample.episode]
        if not sample.is_root:
            ratio = sample.reward / _signed_denominator(sample.root_reward, config.eps)
            advantage *= min(config.ratio_clip, max(-config.ratio_clip, ratio))
        advantages.append(advantage)
    return advantages


#: A credit rule: ``(samples, config, root_rewards, groups) -> one advantage per sample``, with
#: ``root_rewards`` and ``groups`` covering every rollout of the batch.
CreditRule = Callable[
    [Sequence[Sample], CreditConfig, Mapping[int, float], Mapping[int, int]], list[float]
]


def credit_rule_names() -> tuple[str, ...]:
    """Every credit rule name: the bundled ones, then the plug-ins' (nothing is imported)."""
    return REGISTRY.names()


def credit_rule(name: str) -> CreditRule:
    """The rule called ``name``.

    Raises:
        RegistryError: an unknown name (the message lists the valid ones) or a broken entry.
    """
    return REGISTRY.load(name)[1]


def assign_advantages(
    samples: Sequence[Sample],
    config: CreditConfig | None = None,
    root_rewards: Mapping[int, float] | None = None,
    groups: Mapping[int, int] | None = None,
) -> list[float]:
    """One advantage per sample, in order, by the rule ``config.rule`` (module docstring).

    Args:
        samples: The batch's samples (any mix of rollouts, groups and contexts).
        config: The rule and its constants (default: the reference rule).
        root_rewards: ``{episode: root reward}`` of every rollout in the batch; by default
            taken from the samples (pass it when some rollout has no trainable sample).
        groups: ``{episode: group}`` for those rollouts; by default from the samples.

    Raises:
        ValueError: a rollout of ``root_rewards`` without a group.
    """
    config = config or CreditConfig()
    rewards = dict(root_rewards or {})
    owners = dict(groups or {})
    for sample in samples:
        rewards.setdefault(sample.episode, sample.root_reward)
        owners.setdefault(sample.episode, sample.group)
    missing = sorted(set(rewards) - set(owners))
    if missing:
        raise ValueError(f"no group for episodes {missing[:5]}: pass groups for every rollout")
    return credit_rule(config.rule)(samples, config, rewards, owners)
