"""The scripted QA delegator: multi-hop questions answered hop by hop through clones, no model.

On ``SelfCest-MultiHopQA-v0`` the root sees the question and the context keys, never the
paragraphs (``root_view="keys"``). :class:`ScriptedQADelegator` plans the question without
reading anything (:func:`~selfcest_env.tasks.qa.synthetic.reader.plan_question`: the entities
it starts from are named in it, and every paragraph's key is its entity's name), then spends
one round of clones per hop: each clone gets one single-fact question ("Who directed X?") and
the one key whose paragraph states it, and answers from that paragraph; the answers name the
entities of the next hop, whose keys are those names. Comparisons ask one clone per option in
the same round. After the last hop the root composes the answer
(:func:`~selfcest_env.tasks.qa.synthetic.reader.follow`). A context that sees paragraphs (a
clone, or a root under ``root_view="full"``) answers from them at once.

Every clone reads one paragraph, so no context grows with the task's context size: at 32k
tokens of paragraphs (four times the default model's window) the root reads a list of keys and
each clone about a hundred tokens. It answers the synthetic generator's questions exactly,
which makes it the teacher of imitation for QA controllers and a reference point on the
leaderboard.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from selfcest_env.agents.base import AgentInfo
from selfcest_env.agents.scripted import ScriptedAgent, first_user_message
from selfcest_env.protocol import Action, Objective, Return, Spawn
from selfcest_env.tasks.qa.synthetic.reader import QuestionPlan, follow, plan_question, solve
from selfcest_env.tasks.qa.synthetic.relations import RELATIONS

_QUESTION = re.compile(r"^(?:Question|Objective): (?P<text>.+)$", re.MULTILINE)
_KEY = re.compile(r"^- (?P<key>.+)$", re.MULTILINE)
_PARAGRAPH = re.compile(r"^\[(?P<title>[^\]\n]+)\]\n(?P<text>[^\n]*)$", re.MULTILINE)
_ANSWER_LINE = re.compile(r"^turn\d+_clone\d+: (?P<answer>.*)$")
_KEYS_HEADER = "Context keys"


def hop_question(relation: str, entity: str) -> str:
    """The single-fact question a clone is asked for one hop ("Where was X born?")."""
    return RELATIONS[relation].question.format(x=entity)


@dataclass
class ScriptedQADelegator(ScriptedAgent):
    """Answer synthetic multi-hop questions through one round of clones per hop (module
    docstring); ``unknown`` where a question is not of the generator's forms or a clone's
    answer cannot go on."""

    name: str = "scripted-qa-delegate"
    info: ClassVar[AgentInfo] = AgentInfo(
        needs_backend=False,
        sources=("synthetic",),
        description="synthetic multi-hop QA, one round of clones per hop, no model (imitation)",
    )

    def act(self, observation: Mapping[str, Any], info: Mapping[str, Any]) -> Action:
        """Read and answer where paragraphs are in view; else spawn the next hop or answer."""
        messages = info["messages"]
        user = first_user_message(messages)
        found = _QUESTION.search(user)
        if found is None:
            return Return("unknown")
        question = found.group("text").strip()
        paragraphs = {m["title"]: m["text"] for m in _PARAGRAPH.finditer(user)}
        if paragraphs or not info["tools"] or _KEYS_HEADER not in user:
            return Return(solve(question, paragraphs) or "unknown")
        keys = [m["key"].strip() for m in _KEY.finditer(user.split(_KEYS_HEADER, 1)[1])]
        plan = plan_question(question, keys)
        if plan is None:
            return Return("unknown")
        rounds = [m["content"] for m in messages if m["role"] == "tool"]
        return self._next(plan, rounds, set(keys))

    def _next(self, plan: QuestionPlan, rounds: Sequence[str], keys: set[str]) -> Action:
        """The next hop's spawn, or the composed answer once every hop has come back."""
        facts: dict[tuple[str, str], str] = {}
        nodes = [chain.start for chain in plan.chains]
        for hop, message in enumerate(rounds):
            lines = [_ANSWER_LINE.match(line.strip()) for line in message.splitlines()]
            answers = [m.group("answer").strip() for m in lines if m is not None]
            if hop >= plan.hops or len(answers) != len(nodes):
                return Return("unknown")
            for chain, node, answer in zip(plan.chains, nodes, answers):
                facts[(node, chain.relations[hop])] = answer
            nodes = answers
            if hop + 1 < plan.hops and not all(node in keys for node in nodes):
                return Return("unknown")
        if len(rounds) < plan.hops:
            hop = len(rounds)
            return Spawn(
                [
                    Objective(hop_question(chain.relations[hop], node), shared_context=(node,))
                    for chain, node in zip(plan.chains, nodes)
                ]
            )
        answer = follow(plan, lambda entity, rel: facts.get((entity, rel)))
        return Return(answer or "unknown")
