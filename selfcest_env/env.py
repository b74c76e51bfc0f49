"""The SelfCest environment: one task per episode, a tree of contexts, one ledger.

See the README ("The environment contract") for the full contract. In short:

* the root context (id 0) starts with the task; every context is driven by the same policy;
* exactly one context is *active*: ``obs`` describes it and :meth:`SelfCestEnv.step` acts for
  it; :meth:`SelfCestEnv.runnable` and :meth:`SelfCestEnv.step_many` are the batch view for
  drivers that generate several contexts' turns in one model call;
* a turn with a ``spawn_clone`` call starts clones and the context waits until all of them
  have returned, then reads one ``label: answer`` line per clone; a turn without a tool call
  returns (from the root: ends the episode, ``terminated``);
* a clone starts *fresh* (its objective and the context keys it is given) or as a *fork* (a copy
  of its parent's context so far, then its objective); a fork spawned with an inline join
  continues its parent's open message from its path header, and its parent, once every child
  has returned, continues that message with the children's paths in it (the single-stream
  parallel grammars, :class:`~selfcest_env.protocol.Spawn`);
* a context that cannot act (its context window is full, the generation budget is spent, or
  it used its last turn on a tool call) fails with a reason that its parent reads; when the
  root fails the episode is ``truncated`` and ``info["end_reason"]`` says why.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from selfcest_env.budget import Ledger
from selfcest_env.config import EnvConfig
from selfcest_env.grammars import make_grammar
from selfcest_env.grammars.base import Grammar, TurnView
from selfcest_env.observations import context_info, observation
from selfcest_env.prefill import PrefixLedger
from selfcest_env.prompts import (
    answer_line,
    clone_user_message,
    fork_message,
    render_messages,
    root_user_message,
    tool_message,
    turn_chars_left,
)
from selfcest_env.protocol import (
    Action,
    Objective,
    ParsedTurn,
    SpawnCall,
    TurnInput,
    clean_text,
)
from selfcest_env.reward import RewardBreakdown, RewardConfig, clone_reward, terminal_reward
from selfcest_env.safe_grading import grade_safely
from selfcest_env.spaces import action_space, observation_space
from selfcest_env.tasks.base import Grade, TaskInstance, TaskSource
from selfcest_env.text import printable
from selfcest_env.tokens import TokenCounter, as_token_counter
from selfcest_env.trace import EpisodeTrace
from selfcest_env.tree import Context, TurnRecord
from selfcest_env.turns import bounded_turn, charge_turn
from selfcest_env.usage_audit import audit_turns

logger = logging.getLogger(__name__)

#: ``info["end_reason"]`` values: the root answered, a limit ended the episode first, or
#: something outside the policy failed (:data:`ABORT_REASONS`, see :meth:`SelfCestEnv.abort`).
END_REASONS: tuple[str, ...] = (
    "answered",
    "context_limit",
    "gen_budget",
    "turn_limit",
    "backend_error",
)

#: End reasons a driver may end an episode with through :meth:`SelfCestEnv.abort`:
#: ``backend_error``, the model backend failed to produce a turn (server down, timeout, out of
#: memory, malformed response).
ABORT_REASONS: tuple[str, ...] = ("backend_error",)

_FAILURE_END_REASON = {
    "context limit": "context_limit",
    "budget limit": "gen_budget",
    "turn limit": "turn_limit",
}


class SelfCestEnv(gym.Env[dict[str, Any], Any]):
    """A Gymnasium environment in which an agent may spawn clones of itself.

    Args:
        task: Where episodes come from (a :class:`~selfcest_env.tasks.base.TaskSource`).
        config: Limits, reward, prompts and split.
        tokenizer: A Hugging Face tokenizer (exact counts) or ``None`` (the deterministic
            offline counter of :mod:`selfcest_env.tokens`).

    ``reset(options={"index": i})`` plays instance ``i`` of the split; without it the index is
    drawn from the seeded generator.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        task: TaskSource,
        config: EnvConfig | None = None,
        tokenizer: Any | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.task = task
        self.config = config or EnvConfig()
        self.limits = self.config.limits
        self.reward_config = self.config.reward or (
            RewardConfig.qa() if task.domain == "qa" else RewardConfig()
        )
        self.counter: TokenCounter = as_token_counter(tokenizer)
        self.grammar: Grammar = make_grammar(self.config.protocol)
        self.render_mode = render_mode
        self.observation_space = observation_space(self.config.max_prompt_chars)
        self.action_space = action_space(self.config.max_prompt_chars)
        self._contexts: list[Context] = []
        self._runnable: dict[int, None] = {}
        self._instance: TaskInstance | None = None
        self._paragraphs: dict[str, str] = {}
        self._ledger = Ledger(limits=self.limits)
        self._prefixes = PrefixLedger()
        self._end_reason: str | None = None
        self._final: dict[str, Any] = {}
        self._started = 0.0

    # ------------------------------------------------------------------ Gymnasium API

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode on a new task instance; the root context is active."""
        super().reset(seed=seed)
        self._instance = self._choose_instance(options or {})
        self._paragraphs = {item.key: item.text for item in self._instance.context}
        self._contexts = []
        self._runnable = {}
        self._ledger = Ledger(limits=self.limits)
        self._prefixes = PrefixLedger()
        self._end_reason = None
        self._final = {}
        self._started = time.perf_counter()
        may_spawn = self.limits.max_depth > 0
        prompts = self.config.prompts
        messages, open_message = self.grammar.root_messages(
            prompts.root_system if may_spawn else prompts.plain_system,
            root_user_message(
                self._instance.prompt,
                self._paragraphs,
                self.config.root_view,
                may_spawn and self.grammar.uses_tools,
            ),
        )
        root = Context(
            id=0,
            parent=None,
            depth=0,
            label="root",
            objective=self._instance.prompt,
            messages=messages,
            may_spawn=may_spawn,
            open_message=open_message,
        )
        self._contexts.append(root)
        self._enqueue(root)
        return self._observe(root), self._info(root)

    def step(self, action: Action) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Act for the active context (see :mod:`selfcest_env.protocol` for actions).

        Never raises for what a model may write (any text, any structured action); raises
        ``TypeError`` for an object that is not an action and ``RuntimeError`` outside an
        episode.
        """
        self._check_running()
        context = self._contexts[next(iter(self._runnable))]
        self._act(context, self._turn_input(context, action))
        return self._step_result()

    def step_many(
        self, actions: Mapping[int, Action]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Act for several runnable contexts at once (applied in increasing id order).

        Raises:
            ValueError: when an id is not runnable now (the message lists those that are).
            TypeError: when an entry is not an action.

        Every entry is checked before any is applied, so a bad call changes nothing.
        """
        self._check_running()
        if not actions:
            raise ValueError("step_many needs at least one {context_id: action} entry")
        stale = [cid for cid in actions if cid not in self._runnable]
        if stale:
            raise ValueError(
                f"contexts {sorted(stale)} cannot act now; runnable: {sorted(self._runnable)}"
            )
        turns = {
            cid: self._turn_input(self._contexts[cid], actions[cid]) for cid in sorted(actions)
        }
        for cid, turn in turns.items():
            if cid in self._runnable:
                self._act(self._contexts[cid], turn)
        return self._step_result()

    def abort(
        self, error: str, end_reason: str = "backend_error"
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """End the running episode because something outside the policy failed.

        For drivers: when the model backend cannot produce a turn (server down, timeout, out of
        memory, malformed response), the episode cannot go on and must not be scored as the
        policy's failure. The episode is ``truncated``; ``info["end_reason"]`` is
        ``end_reason``, ``info["error"]`` is ``error``; score, reward and every context reward
        are 0; the meters and the trace stand as they are (turns not stepped are not charged).
        Trainers should drop such episodes.

        Returns:
            The final ``(obs, reward, terminated, truncated, info)``, as :meth:`step` would.

        Raises:
            ValueError: ``end_reason`` is not in :data:`ABORT_REASONS`.
            RuntimeError: no episode is running.
        """
        self._check_running()
        if end_reason not in ABORT_REASONS:
            raise ValueError(
                f"cannot abort with end_reason {end_reason!r}; valid: {', '.join(ABORT_REASONS)}"
            )
        self._close_episode(end_reason, None, clean_text(str(error)))
        return self._step_result()

    def runnable(self) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
        """``{context_id: (obs, info)}`` for every context that can act now, in queue order."""
        if self._end_reason is not None:
            return {}
        return {cid: (self._observe(c), self._info(c)) for cid, c in self._runnable_items()}

    def render(self) -> str | None:
        """With ``render_mode="ansi"``: one line per context (id, depth, status, answer)."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(
            f"{'  ' * c.depth}[{c.id}] {printable(c.label)} {c.status}: "
            f"{printable(c.result_text()[:60])}"
            for c in self._contexts
        )

    # ------------------------------------------------------------------ state queries

    @property
    def active_context_id(self) -> int | None:
        """Id of the context that :meth:`step` acts for (``None`` once the episode ended)."""
        if self._end_reason is not None or not self._runnable:
            return None
        return next(iter(self._runnable))

    @property
    def elapsed_s(self) -> float:
        """Wall time since :meth:`reset` (kept out of ``info`` so that episodes replay exactly)."""
        return time.perf_counter() - self._started

    @property
    def ledger(self) -> Ledger:
        """The current episode's meters."""
        return self._ledger

    def gold_answer(self) -> str:
        """The current instance's gold answer, for evaluation code (never shown to agents)."""
        if self._instance is None:
            raise RuntimeError("no episode yet: call reset() first")
        return self._instance.answer

    # ------------------------------------------------------------------ internals

    def _choose_instance(self, options: Mapping[str, Any]) -> TaskInstance:
        if "task" in options:
            if not isinstance(options["task"], TaskInstance):
                raise TypeError("options['task'] must be a TaskInstance")
            return options["task"]
        size = self.task.size(self.config.split)
        if "index" in options:
            index = int(options["index"])
            if index < 0 or (size is not None and index >= size):
                raise IndexError(
                    f"options['index']={index} is outside split {self.config.split!r} "
                    f"of {self.task.name} ({size} instances)"
                )
        else:
            index = int(self.np_random.integers(size if size is not None else 2**31 - 1))
        return self.task.get(self.config.split, index)

    def _check_running(self) -> None:
        if self._instance is None:
            raise RuntimeError("call reset() before step()")
        if self._end_reason is not None:
            raise RuntimeError("the episode has ended; call reset() to start a new one")

    def _runnable_items(self):
        return ((cid, self._contexts[cid]) for cid in self._runnable)

    def _enqueue(self, context: Context) -> None:
        """Make ``context`` runnable, or fail it at once when it cannot act.

        The root at reset is the exception: it stays active so that ``reset`` can return its
        observation, and its first step ends the episode.
        """
        context.status = "runnable"
        context.prompt_ids = self._prompt_ids(context.messages)
        context.prompt_length = (
            self.counter.count_messages(context.messages)
            if context.prompt_ids is None
            else len(context.prompt_ids)
        )
        context.prompt_chars = len(render_messages(context.messages))
        context.length = context.prompt_length
        context.peak_length = max(context.peak_length, context.length)
        self._ledger.record_length(context.length, context.parent is None)
        self._runnable.pop(context.id, None)
        _, reason = self._allowance(context)
        if reason is not None and (context.parent is not None or context.turns):
            self._fail(context, reason)
            return
        self._runnable[context.id] = None

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int] | None:
        """The prompt's token ids, when the counter can give them (for the prefix ledger)."""
        if not (hasattr(self.counter, "prompt_ids") and hasattr(self.counter, "text_ids")):
            return None
        return list(self.counter.prompt_ids(messages))

    def _fail_all_runnable(self, reason: str) -> None:
        """Fail every runnable context (the generation budget is spent)."""
        while self._runnable and self._end_reason is None:
            self._fail(self._contexts[next(iter(self._runnable))], reason)

    def _allowance(self, context: Context) -> tuple[int | None, str | None]:
        """Tokens ``context`` may generate now (``None``: unlimited), or 0 and the reason it
        cannot act."""
        window = self.limits.context_window
        room = math.inf if window is None else window - context.prompt_length
        if room <= 0 or turn_chars_left(context.prompt_chars, self.config.max_prompt_chars) <= 0:
            return 0, "context limit"
        budget = self._ledger.remaining_gen_tokens()
        if budget <= 0:
            return 0, "budget limit"
        cap = math.inf if self.limits.max_new_tokens is None else self.limits.max_new_tokens
        allowance = min(cap, budget, room)
        return (None if allowance == math.inf else int(allowance)), None

    def _act(self, context: Context, turn: TurnInput) -> None:
        self._take_turn(context, turn)
        if self._end_reason is None and self._ledger.remaining_gen_tokens() <= 0:
            self._fail_all_runnable("budget limit")

    def _turn_input(self, context: Context, action: Action) -> TurnInput:
        """``action`` cut to the bounds of ``context``'s next turn (:func:`bounded_turn`)."""
        allowance, _ = self._allowance(context)
        return bounded_turn(
            action,
            allowance,
            self.limits.context_window,
            self.counter,
            turn_chars_left(context.prompt_chars, self.config.max_prompt_chars),
        )

    def _take_turn(self, context: Context, turn: TurnInput) -> None:
        allowance, reason = self._allowance(context)
        if reason is not None:
            self._fail(context, reason)
            return
        charged = charge_turn(turn, allowance, self.counter)
        text, used, truncated = charged.text, charged.used, charged.truncated
        record = TurnRecord(
            index=len(context.turns) + 1,
            prompt_tokens=context.prompt_length,
            gen_tokens=used,
            text=text,
            token_ids=charged.token_ids,
            logprobs=charged.logprobs,
            truncated=truncated,
            reported_usage=turn.reported_usage,
            uncached_prompt_tokens=self._charge_prefill(context, charged.token_ids, text),
        )
        context.turns.append(record)
        ledger = self._ledger
        ledger.prompt_tokens += context.prompt_length
        ledger.uncached_prompt_tokens += record.uncached_prompt_tokens
        ledger.gen_tokens += used
        ledger.truncated_turns += int(truncated)
        context.gen_tokens += used
        context.critical_path_tokens += used
        context.length = context.prompt_length + used
        context.peak_length = max(context.peak_length, context.length)
        ledger.record_length(context.length, context.parent is None)
        if context.open_message:  # the turn continues the context's last message
            record.message = len(context.messages) - 1
            record.offset = len(context.messages[-1]["content"])
            context.messages[-1]["content"] += text
        else:
            record.message = len(context.messages)
            context.messages.append({"role": "assistant", "content": text})
        parsed = turn.parsed if turn.parsed is not None and not charged.cut else None
        if parsed is None:
            parsed = self.grammar.parse(
                TurnView(
                    text=text,
                    stream=context.messages[-1]["content"],
                    is_root=context.parent is None,
                    may_spawn=context.may_spawn,
                    header=context.objective if context.parent is not None else "",
                    max_calls=self.limits.max_tool_calls_per_turn,
                )
            )
        context.messages[-1]["content"] += parsed.appended
        record.repairs = list(parsed.repairs)
        ledger.tool_repairs += len(parsed.repairs)
        if parsed.is_return:
            context.answer, context.marked = parsed.answer, parsed.marked
            context.verbatim = parsed.verbatim
            context.status = "returned"
            self._runnable.pop(context.id, None)
            self._finish(context)
            return
        record.errors = list(parsed.errors)
        ledger.tool_errors += len(parsed.errors)
        if self.limits.max_turns is not None and len(context.turns) >= self.limits.max_turns:
            self._fail(context, "turn limit")
            return
        self._spawn(context, parsed, record)

    def _charge_prefill(
        self, context: Context, token_ids: tuple[int, ...] | None, text: str
    ) -> int:
        """The turn's uncached prompt tokens; its prompt and what it generated are noted as
        processed (:mod:`~selfcest_env.prefill`). Without token ids from the counter, the whole
        prompt counts as uncached."""
        if context.prompt_ids is None:
            return context.prompt_length
        uncached = self._prefixes.uncached(context.prompt_ids)
        generated = list(token_ids) if token_ids is not None else self.counter.text_ids(text)
        self._prefixes.add(context.prompt_ids + generated)
        return uncached

    def _spawn(self, context: Context, parsed: ParsedTurn, record: TurnRecord) -> None:
        lines: list[str | None] = []
        prompts = self.config.prompts
        limits = self.limits
        number = 0
        inline = parsed.inline or (len(parsed.calls) == 1 and parsed.calls[0].join == "inline")
        if inline and not parsed.calls:  # a single-stream turn that neither spawns nor returns
            context.open_message = True
            self._enqueue(context)
            return
        for call in parsed.calls:
            if not context.may_spawn:
                record.errors.append("spawn_clone is not available: depth limit reached")
                self._ledger.tool_errors += 1
            else:
                self._ledger.spawn_calls += 1
            for position, objective in enumerate(call.objectives):
                number += 1
                label = objective.name or f"turn{record.index}_clone{number}"
                failure = None
                if not context.may_spawn:
                    failure = "failed due to depth limit"
                elif limits.max_clones_per_call is not None and position >= (
                    limits.max_clones_per_call
                ):
                    failure = "failed due to clone limit"
                elif limits.max_contexts is not None and len(self._contexts) >= (
                    limits.max_contexts
                ):
                    failure = "failed due to context count limit"
                if failure is not None:
                    if context.may_spawn:
                        self._ledger.tool_errors += 1
                    forked = (call.mode or self.config.spawn_mode) == "fork"
                    lines.append(
                        self.grammar.unstarted(objective, failure, forked)
                        if inline
                        else answer_line(label, failure, prompts)
                    )
                    continue
                child = self._new_clone(context, objective, label, call)
                record.children.append(child.id)
                context.waiting_slots[child.id] = len(lines)
                lines.append(None)
        if not inline:
            lines.extend(f"error: {error}" for error in record.errors)
        context.waiting_join = "inline" if inline else "tool"
        context.waiting_after = parsed.calls[0].after if inline else ""
        context.open_message = inline
        if record.children:
            context.status = "waiting"
            context.waiting_lines = lines
            context.waiting_critical_path = 0
            self._runnable.pop(context.id, None)
            for child_id in record.children:
                self._enqueue(self._contexts[child_id])
            return
        self._join(context, [line for line in lines if line is not None])

    def _join(self, context: Context, lines: list[str]) -> None:
        """Give ``context`` its children's results and make it runnable again: one tool message
        of ``label: answer`` lines, or (inline) their paths and the call's closing text
        appended to its open message."""
        if context.waiting_join == "inline":
            context.messages[-1]["content"] += (
                self.grammar.join_paths(lines) + context.waiting_after
            )
        else:
            context.messages.append(
                {"role": "tool", "content": tool_message(lines, self.config.prompts)}
            )
        self._enqueue(context)

    def _new_clone(
        self, parent: Context, objective: Objective, label: str, call: SpawnCall
    ) -> Context:
        depth = parent.depth + 1
        child = Context(
            id=len(self._contexts),
            parent=parent.id,
            depth=depth,
            label=label,
            objective=objective.instruction,
            messages=[],
            may_spawn=depth < self.limits.max_depth,
            mode=call.mode or self.config.spawn_mode,
            join=call.join,
        )
        if child.mode == "fork":
            self._fork(parent, child, objective)
        elif (own := self.grammar.child_messages(parent, objective)) is not None:
            child.messages, child.open_message = own
        else:
            prompts = self.config.prompts
            system = prompts.clone_system
            if child.may_spawn:
                system = f"{system}\n{prompts.clone_spawn_note}"
            user, missing = clone_user_message(
                objective.instruction, objective.shared_context, self._paragraphs
            )
            child.messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ]
            self._ledger.missing_context_keys += missing
        self._contexts.append(child)
        self._ledger.clones += 1
        self._ledger.max_depth = max(self._ledger.max_depth, depth)
        return child

    def _fork(self, parent: Context, child: Context, objective: Objective) -> None:
        """Start ``child`` from a copy of ``parent``'s context: its objective follows as a tool
        message (a tool join) or as the path header its continuation of the parent's open
        message starts with (an inline join)."""
        child.messages = [dict(message) for message in parent.messages]
        child.inherited = len(child.messages)
        if child.join == "inline":
            last = child.messages[-1]
            child.path_start = len(last["content"])
            last["content"] += objective.instruction
            child.open_message = True
        else:
            header = fork_message(child.label, objective.instruction, self.config.prompts)
            child.messages.append({"role": "tool", "content": header})

    def _fail(self, context: Context, reason: str) -> None:
        context.status = "failed"
        context.failure = f"failed due to {reason}"
        self._runnable.pop(context.id, None)
        self._finish(context)

    def _finish(self, context: Context) -> None:
        if context.parent is None:
            self._end_episode(context)
            return
        parent = self._contexts[context.parent]
        slot = parent.waiting_slots.pop(context.id)
        parent.waiting_lines[slot] = (
            self.grammar.contribution(context)
            if context.join == "inline"
            else answer_line(context.label, context.result_text(), self.config.prompts)
        )
        parent.waiting_critical_path = max(
            parent.waiting_critical_path, context.critical_path_tokens
        )
        if parent.waiting_slots:
            return
        parent.critical_path_tokens += parent.waiting_critical_path
        lines = [line for line in parent.waiting_lines if line is not None]
        parent.waiting_lines = []
        self._join(parent, lines)

    def _end_episode(self, root: Context) -> None:
        assert self._instance is not None
        if root.status == "returned":
            grade = grade_safely(
                self.task, self._instance, root.answer or "", self.config.grade_timeout_s
            )
            self._close_episode("answered", grade, None)
        else:
            reason = _FAILURE_END_REASON[root.failure.removeprefix("failed due to ")]
            self._close_episode(reason, None, None)

    def _close_episode(self, end_reason: str, grade: Grade | None, error: str | None) -> None:
        """Score the episode (no grade: 0), set every reward (an ``error``: all 0), build the
        final info."""
        assert self._instance is not None
        root = self._contexts[0]
        self._end_reason = end_reason
        score = 0.0 if grade is None else float(grade.score)
        details = {} if grade is None else dict(grade.details)
        self._ledger.critical_path_tokens = root.critical_path_tokens
        if error is None:
            breakdown = self._terminal_reward(root, score)
            for context in self._contexts[1:]:
                context.reward = clone_reward(
                    self.reward_config, breakdown.reward, context.marked, context.gen_tokens
                )
        else:
            breakdown = RewardBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            for context in self._contexts[1:]:
                context.reward = 0.0
        root.reward = breakdown.reward
        self._runnable.clear()
        self._final = {
            "end_reason": self._end_reason,
            "error": error,
            "task_id": self._instance.task_id,
            "answer": root.answer,
            "score": score,
            "correct": bool(grade.correct) if grade is not None else False,
            "grade_details": details,
            "grade_error": None if details.get("error") is None else str(details["error"]),
            "reward_breakdown": {
                "score": breakdown.score,
                "root_penalty": breakdown.root_penalty,
                "clone_penalty": breakdown.clone_penalty,
                "repair_penalty": breakdown.repair_penalty,
                "tool_call_penalty": breakdown.tool_call_penalty,
            },
            "context_rewards": {c.id: c.reward for c in self._contexts},
        }
        self._final["trace"] = self.trace()
        self._final["usage_audit"] = audit_turns(t for c in self._contexts for t in c.turns)
        if self.config.reveal_answer:
            self._final["gold_answer"] = self._instance.answer
            self._final["gold_aliases"] = list(self._instance.aliases)

    def _terminal_reward(self, root: Context, score: float) -> RewardBreakdown:
        per_turn = [
            [self._contexts[cid].gen_tokens for cid in turn.children]
            for turn in root.turns
            if turn.children
        ]
        root_calls = sum(1 for turn in root.turns if turn.children)
        return terminal_reward(
            self.reward_config,
            score,
            root.gen_tokens,
            per_turn,
            self._ledger.tool_repairs,
            root_calls,
        )

    def trace(self) -> dict[str, Any]:
        """The whole tree so far (per context its messages, turns, usage, answer and reward), as
        the plain dict of a :class:`~selfcest_env.trace.EpisodeTrace`."""
        assert self._instance is not None
        return EpisodeTrace(
            task_id=self._instance.task_id,
            source=self.task.name,
            split=self.config.split,
            end_reason=self._end_reason,
            error=self._final.get("error"),
            reward=self._contexts[0].reward if self._contexts else None,
            meters=self._ledger.meters(),
            contexts=tuple(context.to_trace() for context in self._contexts),
        ).to_dict()

    def _step_result(self) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._end_reason is not None:
            root = self._contexts[0]
            info = self._info(root)
            info.update(self._final)
            terminated = self._end_reason == "answered"
            return self._observe(root), float(root.reward or 0.0), terminated, not terminated, info
        active = self._contexts[next(iter(self._runnable))]
        return self._observe(active), 0.0, False, False, self._info(active)

    def _observe(self, context: Context) -> dict[str, Any]:
        allowance, _ = self._allowance(context)
        return observation(
            context,
            allowance,
            self._ledger.remaining_gen_tokens(),
            self.limits,
            self.config.max_prompt_chars,
        )

    def _info(self, context: Context) -> dict[str, Any]:
        allowance, _ = self._allowance(context)
        info = context_info(
            context,
            allowance,
            self.task.answer_type,
            list(self._paragraphs),
            self.grammar.uses_tools,
        )
        info["stop"] = list(self.grammar.stop_strings(context))
        info["meters"] = self._ledger.meters()
        info["runnable"] = len(self._runnable)
        return info
