"""Self-consistency's vote reads every clone's answer the way the task's grader does.

The clone answers below are real outputs of the default model (SmolLM2-135M-Instruct, easy
arithmetic, temperature 0.7), taken from the traces that showed self-consistency scoring 0/6
while monolithic scored 1-2/6: the free-text vote picked the first clone whenever no two
answers were spelled alike, and a 512-character tool message cut off the last clones.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import selfcest_env  # noqa: F401  (registers the ids)
from selfcest_env.agents.self_consistency import SelfConsistencyAgent, vote
from selfcest_env.agents.tree_of_thoughts import TreeOfThoughtsAgent, TreeOfThoughtsConfig
from selfcest_env.prompts import PLAIN_SYSTEM_PROMPT, PromptConfig, answer_line, tool_message
from selfcest_env.rollout import ContextView
from selfcest_env.tasks.answers import ANSWER_TYPES, answer_key
from selfcest_env.tasks.math.grading import grade_integer

#: Clone answers of one real episode ("Calculate the value of 1 - 2 + 2.", gold 1).
REAL_ANSWERS = [
    "2 + 2 = 0",
    "1 - 2 + 2 = 1 This answer is not only considered to be a solution to the puzzle",
    "1.",
    "1 - 2 + 2 = 1",
]


def test_answer_keys_follow_each_grader():
    assert answer_key("2 + 7 - 6 = 3.", "integer") == answer_key("Answer: 3", "integer") == "3"
    assert answer_key("So the answer is 1,234.0", "integer") == "1234"
    assert answer_key("no number here", "integer") is None
    assert answer_key("Answer: \\boxed{1,234}", "math") == answer_key("1234 cm", "math") == "1234"
    assert answer_key("Answer: \\frac{1}{2}", "math") == "\\frac{1}{2}"
    assert answer_key("\\frac{1}{ 2 }", "math") == "\\frac{1}{2}"
    assert answer_key("Answer: The Mira Holt.", "text") == answer_key("mira holt", "text")
    assert answer_key("Answer:  ", "text") is None
    assert set(ANSWER_TYPES) == {"integer", "math", "text"}
    with pytest.raises(ValueError, match="valid types: integer, math, text"):
        answer_key("3", "number")


def test_vote_groups_real_clone_answers_as_the_grader_reads_them():
    winner = vote(REAL_ANSWERS, "integer")
    assert grade_integer(winner, 1).correct, winner  # the text vote returned "2 + 2 = 0"
    assert vote(["no idea", "Answer: 7"], "integer") == "Answer: 7"  # unreadable: no vote
    assert vote(["Answer: Mira Holt.", "Bo Lind", "mira holt"], "text") == "Answer: Mira Holt."
    assert vote(["7", "8"], "integer") == "7"  # a tie goes to the answer seen first
    assert vote([None, "", "words"], "integer") == ""


def _views(env, episode: int = 0) -> list[ContextView]:
    return [
        ContextView(episode, cid, obs, info)
        for cid, (obs, info) in env.unwrapped.runnable().items()
    ]


def test_every_clone_answer_reaches_the_vote_and_clones_get_the_solver_prompt():
    agent = SelfConsistencyAgent(backend=None, k=4)  # the root's turns need no model
    env = gym.make("SelfCest-Math-v0", preset="easy", reveal_answer=True, **agent.env_overrides())
    env.reset(seed=0)
    (root,) = _views(env)
    assert root.info["answer_type"] == "integer"
    env.unwrapped.step_many({0: agent.act_batch([root])[0]})
    clones = _views(env)
    assert len(clones) == 4
    for view in clones:
        assert view.info["messages"][0] == {"role": "system", "content": PLAIN_SYSTEM_PROMPT}
    # Four long answers: under the reference 512-character message only the first two arrive.
    padding = "Let me work this out step by step, carefully checking every operation. " * 3
    answers = [f"{padding}So the result is {n}." for n in (5, 6, 9, 9)]
    assert all(200 < len(a) <= PromptConfig().answer_chars for a in answers)
    env.unwrapped.step_many({view.context_id: a for view, a in zip(clones, answers)})
    (root,) = _views(env)
    message = root.info["messages"][-1]["content"]
    # Each clone returns its final answer (the last line, without the full stop).
    assert message.splitlines() == [
        answer_line(f"turn1_clone{i}", a.removesuffix("."), PromptConfig())
        for i, a in enumerate(answers, 1)
    ]
    _, _, terminated, _, info = env.unwrapped.step_many({0: agent.act_batch([root])[0]})
    assert terminated and info["answer"].endswith("So the result is 9")


@pytest.mark.parametrize("width", [1, 4, 9])
def test_prompt_room_fits_every_full_length_answer(width):
    config = PromptConfig().with_room_for(width, turns=11)
    lines = [answer_line(f"turn11_clone{i}", "x" * 999, config) for i in range(1, width + 1)]
    assert tool_message(lines, config) == "\n".join(lines)
    assert PromptConfig(message_chars=10**6).with_room_for(width).message_chars == 10**6


def test_tree_of_thoughts_reads_every_proposal_and_value():
    config = TreeOfThoughtsConfig(breadth=3, samples=3, steps=2)
    prompts = TreeOfThoughtsAgent(backend=None, config=config).env_overrides()["prompts"]
    labels = [f"turn{2 * config.steps + 1}_clone{i}" for i in range(1, 10)]
    lines = [answer_line(label, "y" * 500, prompts) for label in labels]
    assert tool_message(lines, prompts).splitlines() == lines
