"""SelfCest: Gymnasium environments for learned delegation by clones.

Importing the package registers ``SelfCest-Math-v0`` and ``SelfCest-MultiHopQA-v0``;
:func:`make_env` builds the same envs without Gymnasium's wrappers (the batch API at hand).
"""

from selfcest_env.budget import METER_NAMES, Ledger, Limits
from selfcest_env.config import EnvConfig
from selfcest_env.env import END_REASONS, SelfCestEnv
from selfcest_env.protocol import Objective, Return, Spawn, Turn, parse_turn
from selfcest_env.registration import MATH_ENV_ID, QA_ENV_ID, make_env, register_envs
from selfcest_env.reward import CostPenalty, RewardConfig
from selfcest_env.tokens import HFTokenCounter, OfflineTokenCounter, TokenCounter
from selfcest_env.trace import EpisodeTrace

__version__ = "0.1.0"

__all__ = [
    "END_REASONS",
    "MATH_ENV_ID",
    "METER_NAMES",
    "QA_ENV_ID",
    "CostPenalty",
    "EnvConfig",
    "EpisodeTrace",
    "HFTokenCounter",
    "Ledger",
    "Limits",
    "Objective",
    "OfflineTokenCounter",
    "Return",
    "RewardConfig",
    "SelfCestEnv",
    "Spawn",
    "TokenCounter",
    "Turn",
    "make_env",
    "parse_turn",
    "register_envs",
]

register_envs()
