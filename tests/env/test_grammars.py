"""The single-stream parallel grammars: scripted texts replayed through the env, meters by hand.

Counts follow the offline counter's documented rule (a piece is a run of up to four word
characters or one other non-space character; a closed message is 4 tokens plus its content, the
generation prompt 2, an open final assistant message 2 plus its content), so ``<Outline>`` is 4
tokens (``<`` ``Outl`` ``ine`` ``>``), ``</Outline>`` 5, ``<Thread>`` 4, ``</Thread>`` 5,
``<Path>`` 3, ``</Path>`` 4, ``<Goal>`` 3, ``</Goal>`` 4, ``<Parallel>`` 4, ``</Parallel>`` 5.
The task is ``Q1`` (the root's user message: 5 tokens; its first prompt 7).
"""

from __future__ import annotations

import pytest

from selfcest_env import EnvConfig, Limits, SelfCestEnv
from selfcest_env.grammars import grammar_names, make_grammar
from selfcest_env.grammars.apr import clean_path, node_prefix, path_expression
from selfcest_env.grammars.base import TurnView
from selfcest_env.plugins import RegistryError
from selfcest_env.tasks.base import Grade, TaskInstance
from selfcest_env.tasks.math.countdown import grade_countdown
from selfcest_env.trace import EpisodeTrace
from tests.conftest import FixedTasks


def make_env(protocol: str, max_depth: int = 1, **limits: object) -> SelfCestEnv:
    tasks = FixedTasks([TaskInstance("t0", "Q1", "3")])
    config = EnvConfig(
        protocol=protocol, limits=Limits(max_depth=max_depth, max_clones_per_call=4, **limits)
    )
    return SelfCestEnv(tasks, config)


def contexts(env: SelfCestEnv) -> dict[int, dict]:
    return {c["id"]: c for c in env.trace()["contexts"]}


def turn_meters(env: SelfCestEnv) -> list[tuple[int, int, int, int]]:
    """(context, prompt, uncached prompt, generated tokens) of every turn."""
    return [
        (c["id"], t["prompt_tokens"], t["uncached_prompt_tokens"], t["gen_tokens"])
        for c in env.trace()["contexts"]
        for t in c["turns"]
    ]


# ------------------------------------------------------------------------------ ThreadWeaver

OUTLINES = "<Outlines>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n</Outlines>"


def test_threadweaver_block_forks_one_thread_per_outline_and_joins_them_inline():
    """Root turn 1: 4 + 12 + 12 + 5 = 33 tokens. Each thread's prompt: 5 (user) + 2 + 33 + 6
    (``⏎<Thread>⏎k:``) = 46, the first sharing 40 with the root's sequence, the second 44 with
    the first thread's. Thread 1 writes ``x</Thread>`` (6), thread 2 ``y`` (1; the env closes
    it). The root's second prompt: 5 + 2 + 33 + 12 + 12 = 64, sharing all 52 of thread 1's
    sequence; its turn ``</Parallel>⏎Answer: 3`` is 9."""
    env = make_env("threadweaver")
    _, info = env.reset()
    assert info["messages"] == [{"role": "user", "content": "Q1"}]
    assert (info["tools"], info["stop"]) == ([], ["</Outlines>"])
    _, _, _, _, info = env.step(OUTLINES)
    views = env.runnable()
    assert sorted(views) == [1, 2]
    assert views[1][1]["stop"] == ["</Thread>"]
    assert views[1][1]["messages"][-1] == {
        "role": "assistant",
        "content": OUTLINES + "\n<Thread>\n1:",
    }
    env.step_many({1: "x</Thread>", 2: "y"})
    *_, terminated, truncated, info = env.step("</Parallel>\nAnswer: 3")
    assert terminated and info["correct"]
    root = contexts(env)[0]
    assert root["messages"][-1]["content"] == (
        OUTLINES + "\n<Thread>\n1:x</Thread><Thread>\n2:y\n</Thread>\n</Parallel>\nAnswer: 3"
    )
    assert turn_meters(env) == [(0, 7, 7, 33), (0, 64, 12, 9), (1, 46, 6, 6), (2, 46, 2, 1)]
    meters = info["meters"]
    assert (meters["gen_tokens"], meters["critical_path_tokens"]) == (49, 48)
    assert (meters["prompt_tokens"], meters["uncached_prompt_tokens"]) == (163, 27)
    assert (meters["clones"], meters["spawn_calls"], meters["tool_repairs"]) == (2, 1, 1)
    assert contexts(env)[2]["turns"][0]["repairs"] == ["thread not closed: appended </Thread>"]
    assert EpisodeTrace.from_dict(env.trace()).to_dict() == env.trace()


def test_threadweaver_without_outline_ids_numbers_threads_by_position():
    env = make_env("threadweaver")
    env.reset()
    env.step("<Outlines>\n<Outline>first</Outline>\n<Outline>second</Outline>\n</Outlines>\n")
    views = env.runnable()
    assert [v[1]["messages"][-1]["content"][-3:] for v in views.values()] == ["\n1:", "\n2:"]
    assert env.ledger.tool_repairs == 1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<Outlines>\n</Outlines>", "without an <Outline>"),
        ("</Outlines>", "without an <Outline>"),
    ],
)
def test_threadweaver_block_without_outlines_continues_sequentially(text, error):
    env = make_env("threadweaver")
    env.reset()
    env.step(text)
    assert list(env.runnable()) == [0]
    root = contexts(env)[0]
    assert error in root["turns"][0]["errors"][0]
    assert env.ledger.tool_errors == 1 and env.ledger.clones == 0
    *_, terminated, _, info = env.step(" then Answer: 3")
    assert terminated and info["correct"]
    assert contexts(env)[0]["messages"][-1]["content"] == text + " then Answer: 3"


def test_threadweaver_has_no_nesting_and_honours_the_depth_limit():
    env = make_env("threadweaver", max_depth=0)
    env.reset()
    env.step(OUTLINES)
    assert "depth limit" in contexts(env)[0]["turns"][0]["errors"][0]
    env = make_env("threadweaver", max_depth=2)
    env.reset()
    env.step(OUTLINES)
    # a thread that writes a block of its own returns with it as text at its close
    env.step_many({1: OUTLINES + " x</Thread>", 2: "y</Thread>"})
    assert list(env.runnable()) == [0] and env.ledger.clones == 2


def test_threadweaver_clone_limit_closes_the_paths_it_could_not_start():
    env = make_env("threadweaver")
    env.reset()
    outlines = "".join(f"<Outline>{k}: t</Outline>\n" for k in range(1, 7))
    env.step(f"<Outlines>\n{outlines}</Outlines>")
    assert sorted(env.runnable()) == [1, 2, 3, 4]
    env.step_many({cid: "ok</Thread>" for cid in range(1, 5)})
    stream = contexts(env)[0]["messages"][-1]["content"]
    assert stream.endswith(
        "<Thread>\n5:\nfailed due to clone limit\n</Thread>"
        "<Thread>\n6:\nfailed due to clone limit\n</Thread>\n"
    )


# ------------------------------------------------------------------------------ Parallel-R1


def test_parallel_r1_forks_two_paths_then_the_root_writes_the_summary():
    """Root turn ``Think<Parallel>``: 6 tokens. Each path: 5 + 2 + 6 + 3 (``<Path>``) = 16
    tokens of prompt; they write ``p1</Path>`` and ``p22 </Path>`` (5 each). The root's second
    prompt: 5 + 2 + 6 + 8 + 8 + 9 (``</Parallel>⏎<Summary>``) = 38; its turn 12."""
    env = make_env("parallel-r1")
    _, info = env.reset()
    assert info["stop"] == ["<Parallel>"]
    env.step("Think<Parallel>")
    assert sorted(env.runnable()) == [1, 2]
    env.step_many({1: "p1</Path>", 2: "p22 </Path>"})
    *_, terminated, _, info = env.step(" same</Summary>\nFinal Answer: 3")
    assert terminated and info["correct"]
    assert contexts(env)[0]["messages"][-1]["content"] == (
        "Think<Parallel><Path>p1</Path><Path>p22 </Path></Parallel>\n<Summary>"
        " same</Summary>\nFinal Answer: 3"
    )
    prompts = [(cid, prompt) for cid, prompt, _, _ in turn_meters(env)]
    assert prompts == [(0, 7), (0, 38), (1, 16), (2, 16)]
    meters = info["meters"]
    assert (meters["gen_tokens"], meters["critical_path_tokens"]) == (28, 23)
    assert (meters["clones"], meters["tool_repairs"], meters["tool_errors"]) == (2, 0, 0)


def test_parallel_r1_a_path_cut_at_its_token_cap_is_closed_in_the_join():
    env = make_env("parallel-r1", max_new_tokens=6)
    env.reset()
    env.step("Think<Parallel>")  # 6 tokens: the cap
    env.step_many({1: "a b c d e f g", 2: "z</Path>"})
    root = contexts(env)[0]
    assert root["messages"][-1]["content"] == (
        "Think<Parallel><Path>a b c d e f\n</Path><Path>z</Path></Parallel>\n<Summary>"
    )
    assert (env.ledger.truncated_turns, env.ledger.tool_repairs) == (1, 1)


# ------------------------------------------------------------------------------ Multiverse

GOAL = "<Goal>\n<Outline>\n1: a\n</Outline>\n<Outline>\n2: b\n</Outline>\n</Goal>"
NESTED = " x\n<Parallel>\n<Goal>\n<Outline>\n1.1: c\n</Outline>\n</Goal>"


def test_multiverse_paths_nest_and_join_with_a_conclusion():
    """Root turn 1: 3 + 12 + 12 + 4 = 31 tokens. Path 1 opens a block of its own (26 tokens),
    its path 1.1 writes 6, then path 1 concludes (17); path 2 writes 5; the root concludes
    (16). Critical path 31 + (26 + 6 + 17) + 16 = 96 of 101 generated."""
    env = make_env("multiverse", max_depth=2)
    _, info = env.reset()
    assert info["stop"] == ["</Goal>"]
    env.step(GOAL)
    views = env.runnable()
    assert views[1][1]["stop"] == ["</Goal>", "</Path>"]
    assert views[2][1]["messages"][-1]["content"] == GOAL + "\n<Path>\n2:"
    env.step_many({1: NESTED, 2: " y\n</Path>"})
    views = env.runnable()
    assert list(views) == [3]
    assert views[3][1]["messages"][-1]["content"] == GOAL + "\n<Path>\n1:" + NESTED + (
        "\n<Path>\n1.1:"
    )
    env.step(" c done\n</Path>")
    assert list(env.runnable()) == [1]
    env.step("c.\n</Conclusion>\n</Parallel>\n</Path>")
    *_, terminated, _, info = env.step("both\n</Conclusion>\n</Parallel>\nAnswer: 3")
    assert terminated and info["correct"]
    path_one = (
        "\n<Path>\n1:" + NESTED + "\n<Path>\n1.1: c done\n</Path>\n<Conclusion>\n"
        "c.\n</Conclusion>\n</Parallel>\n</Path>\n"
    )
    assert contexts(env)[0]["messages"][-1]["content"] == (
        GOAL + path_one + "<Path>\n2: y\n</Path>\n<Conclusion>\n"
        "both\n</Conclusion>\n</Parallel>\nAnswer: 3"
    )
    meters = info["meters"]
    assert (meters["gen_tokens"], meters["critical_path_tokens"]) == (101, 96)
    assert (meters["clones"], meters["spawn_calls"], meters["max_depth"]) == (3, 2, 2)
    assert EpisodeTrace.from_dict(env.trace()).to_dict() == env.trace()


def test_multiverse_unnumbered_nested_outlines_take_their_path_id():
    env = make_env("multiverse", max_depth=2)
    env.reset()
    env.step(GOAL)
    env.step_many({1: " x\n<Goal>\n<Outline>\nc\n</Outline>\n</Goal>", 2: " y\n</Path>"})
    (view,) = env.runnable().values()
    assert view[1]["messages"][-1]["content"].endswith("\n<Path>\n1.1:")
    assert env.ledger.tool_repairs == 1


def test_multiverse_at_the_depth_limit_a_goal_stays_text():
    env = make_env("multiverse", max_depth=1)
    env.reset()
    env.step(GOAL)
    env.step_many({1: " x\n<Goal>\n<Outline>\n1.1: c\n</Outline>\n</Goal>", 2: " y\n</Path>"})
    assert list(env.runnable()) == [1]
    assert "depth limit" in contexts(env)[1]["turns"][0]["errors"][0]
    env.step(" so c\n</Path>")
    assert list(env.runnable()) == [0] and env.ledger.clones == 2


# ------------------------------------------------------------------------------ APR

APR_PROMPT = "Moving to Node #0\nCurrent State: 27:[22, 26, 31, 53], Operations: []"
APR_EXPAND = (
    "\nExploring Operation: 53-22=31, Resulting Numbers: [26, 31, 31]"
    "\nGenerated Node #0,0: 27:[26, 31, 31] Operation: 53-22=31"
    "\nExploring Operation: 53-31=22, Resulting Numbers: [22, 26, 22]"
    "\nGenerated Node #0,1: 27:[22, 26, 22] Operation: 53-31=22"
    "\n<Calling Sub Searches>"
    "\n<Start Sub Search 0 at level 1> Moving to Node #0,0"
    "\n<Start Sub Search 1 at level 1> Moving to Node #0,1"
    "\n<End Calling Sub Searches>"
)
CHILD_PATH = (
    "Moving to Node #0,1\nCurrent State: 27:[22, 26, 22], Operations: ['53-31=22']"
    "\nExploring Operation: 22/22=1, Resulting Numbers: [26, 1]"
    "\nGenerated Node #0,1,0: 27:[26, 1] Operation: 22/22=1"
    "\nMoving to Node #0,1,0\nCurrent State: 27:[26, 1], Operations: ['53-31=22', '22/22=1']"
    "\nExploring Operation: 26+1=27, Resulting Numbers: [27]\n27,27 equal: Goal Reached"
)
ROOT_PATH = (
    "Moving to Node #0\nCurrent State: 27:[22, 26, 31, 53], Operations: []"
    "\nExploring Operation: 53-31=22, Resulting Numbers: [22, 26, 22]"
    "\nGenerated Node #0,1: 27:[22, 26, 22] Operation: 53-31=22\n" + CHILD_PATH
)


class Countdown27(FixedTasks):
    """APR's Figure 3 problem, graded by the Countdown grader."""

    def __init__(self) -> None:
        super().__init__([TaskInstance("c0", APR_PROMPT, "26 + 22 / (53 - 31)")])

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        return grade_countdown(answer, [22, 26, 31, 53], 27)


def test_apr_spawns_fresh_sub_searches_and_joins_their_paths():
    env = SelfCestEnv(Countdown27(), EnvConfig(protocol="apr", limits=Limits(max_depth=1)))
    _, info = env.reset()
    assert info["messages"] == [{"role": "assistant", "content": APR_PROMPT}]
    env.step(APR_EXPAND)
    views = env.runnable()
    assert [v[1]["messages"] for v in views.values()] == [
        [
            {
                "role": "assistant",
                "content": "Moving to Node #0,0\nCurrent State: 27:[26, 31, 31], "
                "Operations: ['53-22=31']",
            }
        ],
        [
            {
                "role": "assistant",
                "content": "Moving to Node #0,1\nCurrent State: 27:[22, 26, 22], "
                "Operations: ['53-31=22']",
            }
        ],
    ]
    solved = CHILD_PATH.split("\n", 2)[2]  # what follows the child's two prefix lines
    env.step_many({1: "\nNo solution found.", 2: f"\n{solved}\n{CHILD_PATH}"})
    stream = contexts(env)[0]["messages"][-1]["content"]
    assert stream == APR_PROMPT + APR_EXPAND + (
        "\n<Sub Searches>\n<No Solution in Sub Search 0 at level 1 at Node #0,0>\n"
        f"<Goal Reached in Sub Search 1 at level 1 at Node #0,1>\n{CHILD_PATH}\n"
        "<End Sub Searches>\n"
    )
    *_, terminated, _, info = env.step(f"27,27 equal: Goal Reached\n{ROOT_PATH}")
    assert terminated and info["correct"], info
    assert info["answer"] == "26 + (22 / (53 - 31))"
    trace = contexts(env)
    assert [trace[c]["mode"] for c in (1, 2)] == ["fresh", "fresh"]
    assert [trace[c]["label"] for c in (1, 2)] == ["sub search 0", "sub search 1"]
    meters = info["meters"]
    root_turns = [t["gen_tokens"] for t in trace[0]["turns"]]
    longest = max(trace[c]["usage"]["critical_path_tokens"] for c in (1, 2))
    assert meters["critical_path_tokens"] == sum(root_turns) + longest
    assert meters["clones"] == 2 and meters["spawn_calls"] == 1


def test_apr_unknown_node_and_no_goal_are_reported_not_raised():
    env = SelfCestEnv(Countdown27(), EnvConfig(protocol="apr", limits=Limits(max_depth=1)))
    env.reset()
    env.step(
        "\n<Calling Sub Searches>\n<Start Sub Search 0 at level 1> Moving to Node #0,7"
        "\n<End Calling Sub Searches>"
    )
    assert list(env.runnable()) == [0] and env.ledger.tool_errors == 1
    assert "node #0,7 is not in the stream" in contexts(env)[0]["turns"][0]["errors"][0]
    *_, terminated, _, info = env.step("No solution found.")
    assert terminated and not info["correct"] and info["answer"] == ""


def test_apr_helpers():
    stream = APR_PROMPT + APR_EXPAND
    assert node_prefix(stream, "0,0").endswith("Operations: ['53-22=31']")
    assert node_prefix(stream, "0") == APR_PROMPT
    assert node_prefix(stream, "9,9") is None
    assert clean_path("a Goal Reached\nb") is None
    assert clean_path(f"x Goal Reached\n{CHILD_PATH}") == CHILD_PATH
    assert path_expression(APR_PROMPT, ROOT_PATH) == "26 + (22 / (53 - 31))"
    assert path_expression(APR_PROMPT, "Exploring Operation: 5+5=10") is None
    assert path_expression("no state", ROOT_PATH) is None


# ------------------------------------------------------------------------------ every grammar


def test_registry_and_config_errors():
    assert grammar_names() == ("tool-call", "apr", "threadweaver", "parallel-r1", "multiverse")
    with pytest.raises(RegistryError, match="threadweaver"):
        make_grammar("thread-weaver")
    with pytest.raises(ValueError, match="protocol must be one of"):
        EnvConfig(protocol="xml")


HOSTILE = [
    "",
    "</Outlines></Goal><Parallel><End Calling Sub Searches>",
    "<Outlines>" * 5000 + "</Outlines>",
    "<Goal>" + "<Outline>1:" * 3000 + "</Goal>",
    "<Calling Sub Searches>\n"
    + "<Start Sub Search 1 at level 1> Moving to Node #0\n" * 500
    + "<End Calling Sub Searches>",
    "\x1b[2J<Thread>\n1:\udcff</Thread>",
]


@pytest.mark.parametrize("name", ["apr", "threadweaver", "parallel-r1", "multiverse"])
@pytest.mark.parametrize("text", HOSTILE)
def test_no_text_makes_a_grammar_raise_or_run_away(name, text):
    grammar = make_grammar(name)
    for is_root in (True, False):
        for may_spawn in (True, False):
            parsed = grammar.parse(
                TurnView(text=text, stream=text, is_root=is_root, may_spawn=may_spawn)
            )
            assert parsed.is_return or parsed.calls or parsed.errors
    env = make_env(name, max_depth=3, max_contexts=12, max_turns=4)
    env.reset()
    for _ in range(40):
        if env.trace()["end_reason"] is not None:
            break
        env.step_many({cid: text for cid in env.runnable()})
    assert env.trace()["end_reason"] is not None
    assert env.ledger.clones <= 11


class Countdown3(FixedTasks):
    """Reach 3 from [1, 2]."""

    def __init__(self) -> None:
        prompt = "Moving to Node #0\nCurrent State: 3:[1, 2], Operations: []"
        super().__init__([TaskInstance("c1", prompt, "1 + 2")])

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        return grade_countdown(answer, [1, 2], 3)


def test_apr_meters_by_hand():
    """The prompt is 25 pieces, an open assistant message: 27 tokens. Root turn 1 (58 tokens):
    ``Generated Node #0,0: 3:[3] Operation: 1+2=3`` (23) and the calling block (7 + 20 + 8);
    the env adds a newline. The sub search's stream starts with its node (32 pieces: 34
    tokens, sharing 8 with the root's: the message opening and ``Moving to Node #0``) and it
    writes 26. The join adds 5 + 20 + 17 + 6 = 48, so the root's second prompt is 133, of
    which the 85 of its first prompt and turn are cached; its last turn is 65."""
    env = SelfCestEnv(Countdown3(), EnvConfig(protocol="apr", limits=Limits(max_depth=1)))
    env.reset()
    env.step(
        "\nGenerated Node #0,0: 3:[3] Operation: 1+2=3\n<Calling Sub Searches>"
        "\n<Start Sub Search 0 at level 1> Moving to Node #0,0\n<End Calling Sub Searches>"
    )
    (view,) = env.runnable().values()
    assert view[1]["messages"][0]["content"] == (
        "Moving to Node #0,0\nCurrent State: 3:[3], Operations: ['1+2=3']"
    )
    env.step("\n3,3 equal: Goal Reached\nMoving to Node #0,0\n3,3 equal: Goal Reached")
    *_, terminated, _, info = env.step(
        "3,3 equal: Goal Reached\nMoving to Node #0\nCurrent State: 3:[1, 2], Operations: []"
        "\nExploring Operation: 1+2=3, Resulting Numbers: [3]\n3,3 equal: Goal Reached"
    )
    assert terminated and info["correct"] and info["answer"] == "1 + 2"
    assert turn_meters(env) == [(0, 27, 27, 58), (0, 133, 48, 65), (1, 34, 26, 26)]
    meters = info["meters"]
    assert (meters["gen_tokens"], meters["critical_path_tokens"]) == (149, 149)
    assert (meters["prompt_tokens"], meters["uncached_prompt_tokens"]) == (194, 101)
