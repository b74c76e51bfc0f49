"""The action protocol: structured actions, their text form, and the tolerant turn parser.

A turn is either plain text (what a model wrote) or a structured :class:`Spawn` / :class:`Return`.
Text turns use the Hermes/Qwen tool-call format::

    <tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["..."],
                "shared_context": ["key", ...]}}</tool_call>

A turn with at least one ``<tool_call>`` block spawns; a turn without one returns, its answer
being the turn's final answer under the extraction contract of
:mod:`selfcest_env.tasks.extraction` (a box group, the ``Answer:`` line, ``####``, else the last
line), the reading every grader applies too.

:func:`parse_turn` never raises: a malformed call is *repaired* when the intent is unambiguous
(the repair is recorded so that the reward can charge it) and otherwise reported as an *error*
string that the environment sends back to the model as a tool message.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from selfcest_env.tasks.extraction import final_answer
from selfcest_env.tracereader import is_count

logger = logging.getLogger(__name__)

TOOL_NAME = "spawn_clone"

_OPEN_TAG = "<tool_call>"
_CLOSE_TAG = "</tool_call>"
_FENCE = "```"
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD.

    Python strings may hold lone surrogates (``json.loads('"\\ud800"')`` makes one) that cannot
    be encoded as UTF-8, so tokenizers and result files would fail on them; every string the
    environment takes from an action goes through here.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


#: Characters of a clone name kept: it labels the clone's line in its parent's tool message.
MAX_NAME_CHARS = 64


def clean_name(name: str) -> str:
    """A clone name fit for one line of a prompt, a log or a terminal: :func:`clean_text`, then
    every character that is not printable (newlines, tabs, escape and other control bytes,
    bidirectional overrides, zero-width characters) read as a space, runs of space collapsed,
    and at most :data:`MAX_NAME_CHARS` characters kept."""
    printable = "".join(char if char.isprintable() else " " for char in clean_text(name))
    return " ".join(printable.split())[:MAX_NAME_CHARS]


@dataclass(frozen=True)
class Objective:
    """One clone's task: an instruction, an optional label and the context keys it receives."""

    instruction: str
    name: str | None = None
    shared_context: tuple[str, ...] = ()

    def to_json(self) -> str | dict[str, Any]:
        """The JSON value of this objective inside a ``spawn_clone`` call."""
        if self.name is None and not self.shared_context:
            return self.instruction
        value: dict[str, Any] = {"instruction": self.instruction}
        if self.name is not None:
            value["name"] = self.name
        if self.shared_context:
            value["shared_context"] = list(self.shared_context)
        return value


#: How a clone starts: ``fresh`` (SELFCEST: its objective and the context keys it is given) or
#: ``fork`` (APR, ThreadWeaver, Parallel-R1, Multiverse: a copy of its parent's context so far,
#: then its own path header).
SPAWN_MODES: tuple[str, ...] = ("fresh", "fork")

#: How the clones' results re-enter their parent: ``tool``, one tool message of ``label:
#: answer`` lines; ``inline``, each child's contribution appended to the parent's own open
#: message, which the parent then continues (the single-stream grammars): a fork child's path
#: (its header and all it wrote), a fresh child's answer as it returned it (APR's ``join``).
JOIN_MODES: tuple[str, ...] = ("tool", "inline")


@dataclass(frozen=True)
class Spawn:
    """Spawn one clone per objective.

    ``shared_context`` keys go to every clone, on top of each objective's own keys. ``text`` is
    the turn as the model wrote it (by default the canonical tool call); ``token_ids`` and
    ``logprobs`` are the sampled tokens, when known: the ledger then counts exactly those.

    ``mode`` is ``"fresh"`` or ``"fork"`` (:data:`SPAWN_MODES`; ``None``: the env's
    ``spawn_mode``). A fork child starts from a copy of its parent's context; with ``join="tool"``
    it reads its objective in a tool message (the reply to the parent's call), with
    ``join="inline"`` the objective is its *path header*, the text its continuation of the
    parent's open message starts with (``"<Thread>1:"``). With ``join="inline"`` (either mode),
    once every child has returned, the parent's message is extended by each child's
    contribution (:data:`JOIN_MODES`) and then ``after`` (``"</Parallel>"``), and the parent
    continues it. Fork children see what their parent saw: context keys are not added to them.
    """

    objectives: Sequence[Objective | str]
    shared_context: Sequence[str] = ()
    text: str | None = None
    token_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None
    mode: str | None = None
    join: str = "tool"
    after: str = ""

    def to_text(self) -> str:
        """The canonical text form: one ``<tool_call>`` block that parses back to this call
        (the tool-call protocol has no inline join: an inline spawn is written as a call with
        ``mode``, which an agent of a single-stream grammar never sends as text)."""
        arguments: dict[str, Any] = {
            "objectives": [
                o.to_json() if isinstance(o, Objective) else str(o)
                for o in _as_list(self.objectives)
            ]
        }
        if self.shared_context:
            arguments["shared_context"] = _as_list(self.shared_context)
        if self.mode is not None:
            arguments["mode"] = self.mode
        payload = json.dumps({"name": TOOL_NAME, "arguments": arguments}, ensure_ascii=False)
        # "</" only occurs inside JSON strings; "<\/" reads back the same and cannot close the block
        payload = payload.replace("</", "<\\/")
        return f"{_OPEN_TAG}{payload}{_CLOSE_TAG}"


@dataclass(frozen=True)
class Return:
    """Return ``answer`` to the parent (or, from the root, end the episode with it)."""

    answer: str
    text: str | None = None
    token_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None

    def to_text(self) -> str:
        """The canonical text form: ``Answer: <answer>``."""
        return f"Answer: {self.answer}"


@dataclass(frozen=True)
class ReportedUsage:
    """Token counts a backend reported for one turn (an OpenAI-compatible server's ``usage``).

    Kept beside the ledger's own counts of the turn for audit
    (:mod:`~selfcest_env.usage_audit`); never charged: the ledger is the source of truth.
    """

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Turn:
    """A raw model turn with, optionally, the sampled token ids and their logprobs.

    ``truncated``: the backend stopped it at its token cap before the model ended it
    (``finish_reason == "length"``); the env counts it as a truncated turn, as one it cut itself.
    ``reported_usage``: what the backend said the request cost, kept in the trace for audit.
    """

    text: str
    token_ids: Sequence[int] | None = None
    logprobs: Sequence[float] | None = None
    truncated: bool = False
    reported_usage: ReportedUsage | None = None


Action = str | Turn | Spawn | Return


@dataclass(frozen=True)
class SpawnCall:
    """One valid ``spawn_clone`` call after parsing and repair: its objectives, its spawn mode
    (``None``: the env's default), how its children rejoin the parent and the text after an
    inline join (see :class:`Spawn`)."""

    objectives: tuple[Objective, ...]
    mode: str | None = None
    join: str = "tool"
    after: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """What a turn asks for.

    Attributes:
        calls: Valid spawn calls, in order.
        errors: One message per rejected call (sent back to the model).
        repairs: One description per repair applied.
        answer: The returned answer when the turn has no tool call, else ``None``.
        marked: Whether a marker (a box, ``Answer:``, ``####``) introduced the answer.
        verbatim: A structured :class:`Return`'s answer as given, before the extraction that
            makes ``answer`` (what an inline join hands the parent; ``None`` for text turns).
        inline: The turn belongs to a single-stream grammar (:mod:`selfcest_env.grammars`):
            without a spawn or a return the context continues its open message (its errors
            are recorded, not sent as a tool message).
        appended: Text the env writes right after the turn, a repair (a closing tag the
            model left out, a newline before a join).
    """

    calls: tuple[SpawnCall, ...] = ()
    errors: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    answer: str | None = None
    marked: bool = False
    verbatim: str | None = None
    inline: bool = False
    appended: str = ""

    @property
    def is_return(self) -> bool:
        """True when the turn returns an answer instead of calling the tool."""
        return self.answer is not None


@dataclass(frozen=True)
class TurnInput:
    """An action reduced to text, optional token ids / logprobs, and its parse when structured."""

    text: str
    token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None
    parsed: ParsedTurn | None = field(default=None)
    #: Whether the turn was cut before the env charged it: by
    #: :func:`~selfcest_env.turns.clip_action`, or by the backend at its token cap
    #: (``Turn.truncated``). The turn counts as truncated.
    clipped: bool = False
    #: What the backend reported the turn cost (``Turn.reported_usage``), for audit only.
    reported_usage: ReportedUsage | None = None


def _reported_usage(usage: Any) -> ReportedUsage | None:
    """``usage`` when it is a :class:`ReportedUsage` of two 64-bit counts, else ``None``
    (anything else is logged and dropped: it is audit data, never charged)."""
    if usage is None:
        return None
    counts = (getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))
    if isinstance(usage, ReportedUsage) and all(is_count(count) for count in counts):
        return usage
    logger.warning("dropping a reported usage that is not two token counts: %.80r", usage)
    return None


def to_turn_input(action: Action) -> TurnInput:
    """Normalise any accepted action into a :class:`TurnInput`.

    Never raises for a ``str``, :class:`Turn`, :class:`Spawn` or :class:`Return`, whatever their
    fields hold: lone surrogates are replaced (:func:`clean_text`), ``None`` texts and answers
    read as empty, a single objective or key given as a string is one objective or key,
    ``token_ids`` or ``logprobs`` that are not all numbers are dropped (logged), and
    ``logprobs`` without token ids or whose length differs from ``token_ids`` are dropped (the
    latter logged), since the ledger and trainers need one logprob per sampled token. Nothing
    is bounded here: the environment passes actions through
    :func:`~selfcest_env.turns.clip_action` first.

    Raises:
        TypeError: when ``action`` is none of ``str``, :class:`Turn`, :class:`Spawn`,
            :class:`Return`.
    """
    if isinstance(action, str):
        return TurnInput(clean_text(action), None, None)
    if isinstance(action, (Turn, Spawn, Return)):
        token_ids = _numbers(action.token_ids, int, "token ids")
        logprobs = None if token_ids is None else _numbers(action.logprobs, float, "logprobs")
        if token_ids is not None and logprobs is not None and len(logprobs) != len(token_ids):
            logger.warning(
                "dropping %d logprobs given for %d token ids: pass one logprob per sampled token",
                len(logprobs),
                len(token_ids),
            )
            logprobs = None
        if isinstance(action, Turn):
            return TurnInput(
                clean_text(action.text or ""),
                token_ids,
                logprobs,
                clipped=action.truncated is True,
                reported_usage=_reported_usage(action.reported_usage),
            )
        text = clean_text(action.text if action.text is not None else action.to_text())
        if isinstance(action, Return):
            answer = clean_text("" if action.answer is None else str(action.answer))
            parsed = ParsedTurn(
                answer=final_answer(f"Answer: {answer}").text, marked=True, verbatim=answer
            )
        else:
            parsed = _structured_spawn(action)
        return TurnInput(text, token_ids, logprobs, parsed)
    raise TypeError(f"an action must be a str, Turn, Spawn or Return, not {type(action).__name__}")


def _as_list(value: Any) -> list[Any]:
    """A structured field as a list: one string (or objective) is one item, ``None`` none."""
    if value is None:
        return []
    if isinstance(value, (str, Objective)):
        return [value]
    return list(value)


def _numbers(values: Any, convert: Callable[[Any], Any], what: str) -> tuple[Any, ...] | None:
    """``values`` converted one by one, or ``None`` (logged) when one of them does not convert."""
    if values is None:
        return None
    try:
        return tuple(convert(value) for value in values)
    except (TypeError, ValueError, OverflowError) as error:
        logger.warning(
            "dropping %s that are not all numbers (%s): pass a list of numbers", what, error
        )
        return None


def _structured_spawn(action: Spawn) -> ParsedTurn:
    """Validate a structured :class:`Spawn` with the same rules as a parsed tool call, plus its
    join (one of :data:`JOIN_MODES`)."""
    arguments = {
        "objectives": [
            o.to_json() if isinstance(o, Objective) else o for o in _as_list(action.objectives)
        ],
        "shared_context": _as_list(action.shared_context),
    }
    if action.mode is not None:
        arguments["mode"] = action.mode
    repairs: list[str] = []
    call, error = _validate_call({"name": TOOL_NAME, "arguments": arguments}, repairs)
    if call is not None and action.join != "tool":
        if action.join not in JOIN_MODES:
            call, error = None, f"join must be one of {', '.join(JOIN_MODES)}, got {action.join!r}"
        else:  # a path header is text to continue: its white space is kept as written
            after = clean_text("" if action.after is None else str(action.after))
            headers = [
                o.instruction if isinstance(o, Objective) else str(o)
                for o in _as_list(action.objectives)
            ]
            objectives = tuple(
                replace(objective, instruction=clean_text(header))
                for objective, header in zip(call.objectives, headers)
            )
            call = SpawnCall(objectives, call.mode, "inline", after)
    return ParsedTurn(
        calls=() if call is None else (call,),
        errors=() if error is None else (error,),
        repairs=tuple(repairs),
    )


def extract_answer(text: str) -> tuple[str, bool]:
    """The answer in a returning turn and whether a marker (a box, ``Answer:``, ``####``)
    introduced it: the final answer of the extraction contract
    (:func:`selfcest_env.tasks.extraction.final_answer`), the same reading every grader applies.
    """
    found = final_answer(text)
    return found.text, found.marked


def parse_turn(text: str, max_tool_calls: int = 10) -> ParsedTurn:
    """Parse one model turn; never raises (see the module docstring).

    Linear in the length of ``text``: a megabyte of hostile output parses in milliseconds.
    """
    text = clean_text(text)
    bodies, repairs = _tool_call_bodies(text)
    if not bodies:
        answer, marked = extract_answer(text)
        return ParsedTurn(answer=answer, marked=marked)
    calls: list[SpawnCall] = []
    errors: list[str] = []
    for number, body in enumerate(bodies, start=1):
        if number > max_tool_calls:
            errors.append(
                f"tool call {number} ignored: at most {max_tool_calls} tool calls per turn"
            )
            continue
        payload, error = _load_json(body, repairs)
        if error is None:
            call, error = _validate_call(payload, repairs)
            if call is not None:
                calls.append(call)
        if error is not None:
            errors.append(f"tool call {number}: {error}")
    return ParsedTurn(calls=tuple(calls), errors=tuple(errors), repairs=tuple(repairs))


def _tool_call_bodies(text: str) -> tuple[list[str], list[str]]:
    """The bodies of the ``<tool_call>`` blocks in ``text`` and the repairs needed to find them.

    One left-to-right scan: each block runs from its opening tag to the next closing tag; an
    opening tag without a closing one takes the rest of the turn.
    """
    bodies: list[str] = []
    repairs: list[str] = []
    position = 0
    while (opening := text.find(_OPEN_TAG, position)) >= 0:
        start = opening + len(_OPEN_TAG)
        closing = text.find(_CLOSE_TAG, start)
        if closing < 0:
            bodies.append(text[start:])
            repairs.append("closed an unterminated <tool_call> block")
            break
        bodies.append(text[start:closing])
        position = closing + len(_CLOSE_TAG)
    if not bodies and TOOL_NAME in text and "{" in text:
        candidate = text[text.find("{") : text.rfind("}") + 1]
        payload, error = _decode(candidate)
        if error is None and isinstance(payload, dict) and payload.get("name") == TOOL_NAME:
            bodies.append(candidate)
            repairs.append("read a spawn_clone call written without <tool_call> tags")
    return bodies, repairs


def _load_json(body: str, repairs: list[str]) -> tuple[Any, str | None]:
    """Decode a tool-call body, repairing code fences, quotes, trailing commas and brackets."""
    body = body.strip()
    if len(body) >= 2 * len(_FENCE) and body.startswith(_FENCE) and body.endswith(_FENCE):
        body = body[len(_FENCE) : -len(_FENCE)].removeprefix("json").strip()
        repairs.append("removed a code fence around the tool call")
    if not body:
        return None, "empty tool call: write a JSON object with 'name' and 'arguments'"
    payload, first_error = _decode(body)
    if first_error is None:
        return payload, None
    candidates = []
    fixed = _TRAILING_COMMA.sub(r"\1", body)
    candidates.append(fixed)
    if '"' not in fixed:
        candidates.append(fixed.replace("'", '"'))
    for candidate in list(candidates):
        closed = _close_brackets(candidate)
        if closed is not None:
            candidates.append(closed)
    for candidate in candidates:
        payload, error = _decode(candidate)
        if error is None:
            repairs.append("repaired invalid JSON in a tool call")
            return payload, None
    return None, (
        f"invalid JSON ({first_error}); write "
        '{"name": "spawn_clone", "arguments": {"objectives": ["..."]}}'
    )


def _decode(text: str) -> tuple[Any, str | None]:
    """``json.loads`` that reports, instead of raising, bad or absurdly nested JSON."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as error:
        return None, f"{error.msg} at character {error.pos}"
    except RecursionError:
        return None, "nested too deeply"


def _close_brackets(text: str) -> str | None:
    """``text`` with its unclosed ``{``/``[`` closed, or ``None`` when it is not that simple."""
    stack: list[str] = []
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and (not stack or stack.pop() != char):
            return None
    if in_string or not stack:
        return None
    return text + "".join(reversed(stack))


def _validate_call(payload: Any, repairs: list[str]) -> tuple[SpawnCall | None, str | None]:
    """Check a decoded call against the ``spawn_clone`` schema, repairing what is unambiguous."""
    if not isinstance(payload, dict):
        return None, "a tool call must be a JSON object with 'name' and 'arguments'"
    name = payload.get("name")
    arguments = payload.get("arguments", payload.get("parameters"))
    if name is None:
        if arguments is None and "objectives" not in payload:
            return None, "the tool call has no 'name'; the only tool is spawn_clone"
        repairs.append("assumed the missing tool name spawn_clone")
    elif name != TOOL_NAME:
        return None, f"unknown tool {str(name)[:40]!r}; the only tool is spawn_clone"
    if arguments is None and "objectives" in payload:
        arguments = {k: v for k, v in payload.items() if k != "name"}
        repairs.append("read arguments written next to the tool name")
    if isinstance(arguments, str):
        arguments, error = _decode(arguments)
        if error is not None:
            return None, "'arguments' is a string that is not JSON; pass a JSON object"
        repairs.append("decoded arguments given as a JSON string")
    if not isinstance(arguments, dict):
        return None, "'arguments' must be an object with 'objectives' and 'shared_context'"
    shared, error = _keys(arguments.get("shared_context"), "shared_context", repairs)
    if error is not None:
        return None, error
    raw_objectives = arguments.get("objectives")
    if isinstance(raw_objectives, (str, dict)):
        raw_objectives = [raw_objectives]
        repairs.append("wrapped a single objective in a list")
    if not isinstance(raw_objectives, list) or not raw_objectives:
        return None, "'objectives' must be a non-empty list of instructions"
    objectives: list[Objective] = []
    for number, raw in enumerate(raw_objectives, start=1):
        objective, error = _objective(raw, number, shared, repairs)
        if error is not None:
            return None, error
        objectives.append(objective)
    mode = arguments.get("mode")
    if mode is not None and mode not in SPAWN_MODES:
        return None, f"'mode' must be one of {', '.join(map(repr, SPAWN_MODES))}"
    return SpawnCall(tuple(objectives), mode), None


def _objective(
    raw: Any, number: int, shared: tuple[str, ...], repairs: list[str]
) -> tuple[Objective | None, str | None]:
    """One objective from its JSON value (a string or an object with ``instruction``)."""
    if isinstance(raw, str):
        if not raw.strip():
            return None, f"objective {number} is empty"
        return Objective(clean_text(raw).strip(), None, shared), None
    if not isinstance(raw, dict):
        return None, f"objective {number} must be a string or an object with 'instruction'"
    instruction = raw.get("instruction")
    if instruction is None:
        for alias in ("objective", "task", "prompt"):
            if isinstance(raw.get(alias), str):
                instruction = raw[alias]
                repairs.append(f"read objective {number}'s instruction from '{alias}'")
                break
    if not isinstance(instruction, str) or not instruction.strip():
        return None, f"objective {number} needs a non-empty string 'instruction'"
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        return None, f"objective {number}: 'name' must be a string"
    own, error = _keys(raw.get("shared_context"), f"objective {number} shared_context", repairs)
    if error is not None:
        return None, error
    keys = tuple(dict.fromkeys(shared + own))
    name = clean_name(name) if name else None
    return Objective(clean_text(instruction).strip(), name or None, keys), None


def _keys(raw: Any, where: str, repairs: list[str]) -> tuple[tuple[str, ...], str | None]:
    """A tuple of context keys from ``None``, a string or a list of strings."""
    if raw is None:
        return (), None
    if isinstance(raw, str):
        repairs.append(f"wrapped a single {where} key in a list")
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
        return (), f"'{where}' must be a list of context keys (strings)"
    return tuple(dict.fromkeys(clean_text(key) for key in raw)), None
