"""Fork spawning and the prefix-aware prefill meter, hand-computed on small trees.

Every figure below is worked out by hand with the offline counter's documented rule (a piece is a
run of up to four word characters or one other non-space character; a closed message is 4 tokens
plus its content, the generation prompt 2, an open final assistant message 2 plus its content)
and the prefill rule of :mod:`selfcest_env.prefill` (a turn's uncached prompt tokens are those
after the longest prefix it shares with a sequence processed before it: an earlier prompt
followed by what that turn generated).

The prompts are tiny: root system ``Solve.`` (3 pieces), clone system ``Help.`` (2), task
``Q1`` (1), fork header ``Do {objective}``. So the root's first prompt is 7 + 5 + 2 = 14 tokens.
"""

from __future__ import annotations

import pytest

from selfcest_env import EnvConfig, Limits, Return, SelfCestEnv, Spawn
from selfcest_env.prefill import PrefixLedger
from selfcest_env.prompts import PromptConfig
from selfcest_env.tasks.base import TaskInstance
from selfcest_env.trace import EpisodeTrace
from tests.conftest import FixedTasks

PROMPTS = PromptConfig(
    root_system="Solve.", clone_system="Help.", fork_header="Do {objective}", clone_spawn_note=""
)


def make_env(answer: str = "3", **config: object) -> SelfCestEnv:
    limits = config.pop("limits", Limits(max_depth=1, max_clones_per_call=4))
    tasks = FixedTasks([TaskInstance("t0", "Q1", answer)])
    return SelfCestEnv(tasks, EnvConfig(limits=limits, prompts=PROMPTS, **config))


def by_context(env: SelfCestEnv) -> dict[int, dict]:
    return {c["id"]: c for c in env.trace()["contexts"]}


def turn_meters(env: SelfCestEnv) -> list[tuple[int, int, int]]:
    """(context, prompt tokens, uncached prompt tokens) of every turn, context by context."""
    return [
        (c["id"], t["prompt_tokens"], t["uncached_prompt_tokens"])
        for c in env.trace()["contexts"]
        for t in c["turns"]
    ]


# ------------------------------------------------------------------------------ the prefix ledger


def test_prefix_ledger_counts_what_no_earlier_sequence_starts_with():
    ledger = PrefixLedger()
    assert ledger.uncached([1, 2, 3]) == 3
    ledger.add([1, 2, 3, 4])
    assert ledger.uncached([1, 2, 3]) == 0  # wholly inside an earlier sequence
    assert ledger.uncached([1, 2, 9, 9]) == 2
    assert ledger.uncached([7]) == 1
    ledger.add([1, 2, 9])
    assert ledger.uncached([1, 2, 9, 5]) == 1  # the longest shared prefix counts
    ledger.add([1, 2, 3, 4, 5, 6])  # extends the first sequence, which is dropped
    assert ledger.uncached([1, 2, 3, 4, 5, 6, 7]) == 1
    assert len(ledger._sequences) == 2
    ledger.add([])
    assert ledger.uncached([]) == 0


# ------------------------------------------------------------------------------ fresh clones


def test_fresh_clones_share_their_system_prompt_once():
    """Root 14 tokens; each clone 6 (``Help.``) + 9 (``Objective: A``) + 2 = 17, sharing 2 with
    the root (the system message's opening) and the second 12 with the first; the root's second
    prompt (33) shares its first prompt and the turn it wrote (15)."""
    env = make_env()
    env.reset()
    env.step(Spawn(["A", "B"], text="go"))
    env.step_many({1: Return("1", text="x"), 2: Return("2", text="y")})
    *_, info = env.step(Return("3", text="z"))
    assert turn_meters(env) == [(0, 14, 14), (0, 33, 18), (1, 17, 15), (2, 17, 5)]
    assert info["meters"]["prompt_tokens"] == 81
    assert info["meters"]["uncached_prompt_tokens"] == 52
    usage = {c["id"]: c["usage"]["uncached_prompt_tokens"] for c in env.trace()["contexts"]}
    assert usage == {0: 32, 1: 15, 2: 5}
    assert all(c["mode"] == "fresh" for c in env.trace()["contexts"])


# ------------------------------------------------------------------------------ forks, tool join


def test_fork_children_copy_the_context_and_read_their_objective_as_the_tool_reply():
    """Each fork child: the root's chat (14 tokens with the root's turn ``go``: 7 + 5 + 5) plus a
    tool message ``Do A`` (6) and the generation prompt = 25 tokens; the first shares 15 with the
    root's sequence, the second 20 with the first's. The root's second prompt (33) shares the
    19 tokens up to the role of its tool message."""
    env = make_env()
    env.reset()
    env.step(Spawn(["A", "B"], text="go", mode="fork"))
    contexts = by_context(env)
    assert contexts[1]["messages"] == [
        {"role": "system", "content": "Solve."},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "go"},
        {"role": "tool", "content": "Do A"},
    ]
    assert (contexts[1]["mode"], contexts[1]["join"], contexts[1]["inherited"]) == (
        "fork",
        "tool",
        3,
    )
    env.step_many({1: Return("1", text="x"), 2: Return("2", text="y")})
    *_, info = env.step(Return("3", text="z"))
    assert turn_meters(env) == [(0, 14, 14), (0, 33, 14), (1, 25, 10), (2, 25, 5)]
    assert info["meters"]["prompt_tokens"] == 97
    assert info["meters"]["uncached_prompt_tokens"] == 43
    assert info["meters"]["clones"] == 2 and info["correct"]
    root_tool = by_context(env)[0]["messages"][3]
    assert root_tool == {"role": "tool", "content": "turn1_clone1: 1\nturn1_clone2: 2"}
    assert EpisodeTrace.from_dict(env.trace()).to_dict() == env.trace()


def test_the_env_default_spawn_mode_and_the_text_protocol_mode_argument():
    env = make_env(spawn_mode="fork")
    env.reset()
    env.step(Spawn(["A"], text="go"))
    assert by_context(env)[1]["mode"] == "fork"

    env = make_env()
    env.reset()
    call = '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["A"], "mode": "fork"}}'
    env.step(call + "</tool_call>")
    child = by_context(env)[1]
    assert child["mode"] == "fork" and child["messages"][-1] == {"role": "tool", "content": "Do A"}

    env.reset()
    bad = '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["A"], "mode": "copy"}}'
    *_, info = env.step(bad + "</tool_call>")
    assert info["meters"]["clones"] == 0 and info["meters"]["tool_errors"] == 1
    assert "'mode' must be one of 'fresh', 'fork'" in info["messages"][-1]["content"]


def test_bad_structured_spawns_are_tool_errors_not_exceptions():
    env = make_env()
    env.reset()
    *_, info = env.step(Spawn(["A"], mode="clone"))
    assert (
        info["meters"]["clones"] == 0 and "'mode' must be one of" in info["messages"][-1]["content"]
    )
    *_, info = env.step(Spawn(["A"], mode="fork", join="merge"))
    assert info["meters"]["clones"] == 0
    assert "join must be one of tool, inline" in info["messages"][-1]["content"]


# ------------------------------------------------------------------------------ forks, inline join


def test_inline_forks_continue_the_parents_open_message_and_join_into_it():
    """A ThreadWeaver-like block: the root writes ``<P>`` (3 pieces); each child continues the
    open message from its header ``<T>1:`` (22 tokens: 7 + 5 + 2 + 8, of which 17 are the root's
    sequence, and 20 for the second child, which shares the first's ``<T>`` too); the join puts
    both paths and ``</P>`` into the root's message, whose next prompt (41 tokens: 14 + 27
    pieces) starts with the whole of the first child's sequence (27)."""
    env = make_env(answer="ab")
    env.reset()
    env.step(Spawn(["<T>1:", "<T>2:"], text="<P>", mode="fork", join="inline", after="</P>"))
    child = by_context(env)[1]
    assert child["messages"][-1] == {"role": "assistant", "content": "<P><T>1:"}
    assert env.runnable()[1][1]["messages"][-1] == {"role": "assistant", "content": "<P><T>1:"}
    env.step_many({1: Return("a", text=" a</T>"), 2: Return("b", text=" b</T>")})
    root = by_context(env)[0]
    assert root["messages"][-1] == {"role": "assistant", "content": "<P><T>1: a</T><T>2: b</T></P>"}
    assert root["status"] == "runnable"
    *_, info = env.step(Return("ab", text="\nAnswer: ab"))
    assert info["correct"]
    assert turn_meters(env) == [(0, 14, 14), (0, 41, 14), (1, 22, 5), (2, 22, 2)]
    meters = info["meters"]
    assert (meters["prompt_tokens"], meters["uncached_prompt_tokens"]) == (99, 35)
    assert (meters["gen_tokens"], meters["critical_path_tokens"]) == (17, 12)
    root = by_context(env)[0]
    assert root["messages"][-1]["content"] == "<P><T>1: a</T><T>2: b</T></P>\nAnswer: ab"
    assert [(t["message"], t["offset"]) for t in root["turns"]] == [(2, 0), (2, 29)]
    assert [(t["message"], t["offset"]) for t in by_context(env)[2]["turns"]] == [(2, 8)]
    assert len(root["messages"]) == 3  # one open assistant message holds both turns and the join
    assert EpisodeTrace.from_dict(env.trace()).to_dict() == env.trace()


def test_inline_fresh_children_join_with_their_answers_verbatim():
    """APR's join: fresh children, each hands back the message it returns, unextracted."""
    env = make_env(answer="ok")
    env.reset()
    env.step(Spawn(["s1", "s2"], text="<S>", join="inline", after="<E>"))
    assert by_context(env)[1]["messages"][0] == {"role": "system", "content": "Help."}
    env.step_many(
        {1: Return("<R1>\nline one\nline two\n", text="t"), 2: Return("<N2>\n", text="u")}
    )
    root = by_context(env)[0]
    assert root["messages"][-1]["content"] == "<S><R1>\nline one\nline two\n<N2>\n<E>"


def test_a_fork_that_does_not_fit_fails_and_its_path_says_so():
    """Under a window of 23 the first child (14 + 11 = 25 tokens) fails at once with the context
    limit, the second (22) may write one token; the join carries the first's header and reason,
    and the root, now past the window, fails too."""
    env = make_env(limits=Limits(max_depth=1, context_window=23))
    env.reset()
    env.step(Spawn(["<T>1: long header", "<T>2:"], text="<P>", mode="fork", join="inline"))
    failed = by_context(env)[1]
    assert (failed["status"], failed["failure"]) == ("failed", "failed due to context limit")
    assert env.runnable()[2][1]["max_new_tokens"] == 1
    *_, info = env.step_many({2: Return("b", text=" b")})
    assert info["end_reason"] == "context_limit"
    content = by_context(env)[0]["messages"][-1]["content"]
    assert content == "<P><T>1: long header\nfailed due to context limit<T>2: b"


def test_rejected_inline_children_join_with_their_header_and_the_reason():
    env = make_env(limits=Limits(max_depth=1, max_clones_per_call=1))
    env.reset()
    env.step(Spawn(["<T>1:", "<T>2:"], text="<P>", mode="fork", join="inline", after="</P>"))
    env.step_many({1: Return("a", text=" a")})
    content = by_context(env)[0]["messages"][-1]["content"]
    assert content == "<P><T>1: a<T>2:\nfailed due to clone limit</P>"


def test_nested_inline_forks_join_level_by_level():
    """Depth 2: a child opens its own block; its children continue its open message, which
    holds the root's text, its header and its block; the root's join holds the nested join."""
    env = make_env(answer="x", limits=Limits(max_depth=2, max_clones_per_call=2))
    env.reset()
    env.step(Spawn(["[1", "[2"], text="<", mode="fork", join="inline", after=">"))
    env.step_many(
        {
            1: Spawn(["(a", "(b"], text=":", mode="fork", join="inline", after=";"),
            2: Return("2", text="]"),
        }
    )
    grandchild = by_context(env)[3]
    assert grandchild["messages"][-1]["content"] == "<[1:(a"
    assert grandchild["depth"] == 2 and grandchild["inherited"] == 3
    env.step_many({3: Return("a", text=")"), 4: Return("b", text=")")})
    assert by_context(env)[1]["messages"][-1]["content"] == "<[1:(a)(b);"
    env.step_many({1: Return("1", text="]")})
    assert by_context(env)[0]["messages"][-1]["content"] == "<[1:(a)(b);][2]>"
    *_, info = env.step(Return("x", text="x"))
    assert info["correct"] and info["meters"]["max_depth"] == 2
    # Critical path: child 1 writes 1 token, waits for its slower grandchild (1), writes 1: 3;
    # the root writes 1, waits for child 1 (3), writes 1: 5.
    assert info["meters"]["critical_path_tokens"] == 5
    assert by_context(env)[1]["usage"]["critical_path_tokens"] == 3
    assert EpisodeTrace.from_dict(env.trace()).to_dict() == env.trace()


# ------------------------------------------------------------------------------ old traces


def test_a_trace_written_before_forks_and_the_prefill_meter_still_reads():
    env = make_env()
    env.reset()
    env.step(Spawn(["A"], text="go"))
    env.step_many({1: Return("1", text="x")})
    env.step(Return("3", text="z"))
    old = env.trace()
    del old["meters"]["uncached_prompt_tokens"]
    for context in old["contexts"]:
        for key in ("mode", "join", "inherited"):
            context.pop(key, None)
        del context["usage"]["uncached_prompt_tokens"]
        for turn in context["turns"]:
            for key in ("uncached_prompt_tokens", "message", "offset"):
                del turn[key]
    read = EpisodeTrace.from_dict(old)
    assert read.to_dict() == old
    assert read.root.turn_places() == [(2, 0), (4, 0)]
    assert read.root.usage.uncached_prompt_tokens is None


@pytest.mark.parametrize("mode", ["fresh", "fork"])
def test_every_meter_of_a_fork_episode_is_at_most_the_prompt_tokens(mode):
    env = make_env(spawn_mode=mode)
    env.reset()
    env.step(Spawn(["A", "B", "C"], text="go"))
    env.step_many({i: Return(str(i), text="x") for i in (1, 2, 3)})
    *_, info = env.step(Return("3", text="z"))
    meters = info["meters"]
    assert 0 < meters["uncached_prompt_tokens"] < meters["prompt_tokens"]
    for context in env.trace()["contexts"]:
        usage = context["usage"]
        assert usage["uncached_prompt_tokens"] <= usage["prompt_tokens"]
        assert usage["uncached_prompt_tokens"] == sum(
            t["uncached_prompt_tokens"] for t in context["turns"]
        )
