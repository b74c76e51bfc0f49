"""What a turn costs: an action cut to the bounds of its turn, then charged to the ledger.

A step's work and memory follow its token limits, not the size of the action:
:func:`bounded_turn` cuts what an action carries before anything reads it, and
:func:`charge_turn` gives the tokens the turn is charged (its token ids when they are tokens of
the counter, else its counted text), truncated to the turn's allowance.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from selfcest_env.protocol import Action, Objective, Return, Spawn, Turn, TurnInput, to_turn_input
from selfcest_env.tokens import TokenCounter, chars_per_token, token_id_limit

logger = logging.getLogger(__name__)


def clip_action(action: Any, max_chars: int, max_ids: int | None = None) -> tuple[Any, bool]:
    """``action`` with what it carries cut to bounds, and whether anything was cut.

    For the environment, before it reads an action at all, so that a step's work and memory
    follow its bounds instead of the action's size: a text (a ``str`` action, a turn's ``text``,
    a return's ``answer``) keeps its first ``max_chars`` characters; a spawn's objectives and
    keys share one budget of ``max_chars``, each string taking its length plus one and every
    other value (a list, an objective, ``None``) one, so that a million empty strings are bounded
    too; what lies past the budget is cut or dropped (so are structures nested deeper than a
    spawn's documented form); ``token_ids`` and ``logprobs`` keep their first ``max_ids`` values
    (not counted as a cut: the environment truncates a turn longer than its allowance itself,
    and compares the two lengths over what is kept). Anything that is not an action comes back
    unchanged, for :func:`to_turn_input` to reject.
    """
    if isinstance(action, str):
        return action[:max_chars], len(action) > max_chars
    if not isinstance(action, (Turn, Spawn, Return)):
        return action, False
    changes: dict[str, Any] = {
        "token_ids": _head(action.token_ids, max_ids),
        "logprobs": _head(action.logprobs, max_ids),
    }
    clipped = False
    names = ("text", "answer") if isinstance(action, Return) else ("text",)
    for name in names:
        value = getattr(action, name)
        if isinstance(value, str) and len(value) > max_chars:
            changes[name], clipped = value[:max_chars], True
    if isinstance(action, Spawn):
        clipper = _Clipper(max_chars)
        changes["objectives"] = clipper(action.objectives)
        changes["shared_context"] = clipper(action.shared_context)
        clipped = clipped or clipper.cut
    return replace(action, **changes), clipped


def _head(values: Any, count: int | None) -> Any:
    """The first ``count`` of ``values`` (all of them when ``count`` is ``None``; values that
    cannot be iterated as they are, for :func:`~selfcest_env.protocol.to_turn_input` to report)."""
    if values is None or count is None:
        return values
    try:
        return list(islice(values, count))
    except TypeError:
        return values


class _Clipper:
    """Cuts a spawn's fields to one shared character budget (see :func:`clip_action`)."""

    #: Nesting kept below a field: objective list, objective object, its key list, a key.
    MAX_DEPTH = 3

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.cut = False

    def __call__(self, value: Any, depth: int = 0) -> Any:
        """``value`` cut to what is left of the budget."""
        if isinstance(value, str):
            piece = value[: max(self.left, 0)]
            self.cut = self.cut or len(piece) < len(value)
            self.left -= len(piece) + 1
            return piece
        self.left -= 1
        if isinstance(value, Objective):
            return Objective(
                self(value.instruction, depth + 1),
                self(value.name, depth + 1),
                self(value.shared_context, depth + 1),
            )
        if not isinstance(value, (Mapping, Sequence)):
            return value
        if depth >= self.MAX_DEPTH:
            self.cut = True
            return None
        mapping = isinstance(value, Mapping)
        kept: list[Any] = []
        for item in value.items() if mapping else value:
            if self.left <= 0:
                self.cut = True
                break
            if mapping:
                key, entry = item
                kept.append((self(key, depth + 1), self(entry, depth + 1)))
            else:
                kept.append(self(item, depth + 1))
        if mapping:
            return dict(kept)
        return tuple(kept) if isinstance(value, tuple) else kept


def bounded_turn(
    action: Action,
    allowance: int | None,
    context_window: int | None,
    counter: TokenCounter,
    max_turn_chars: int,
) -> TurnInput:
    """``action`` cut to the bounds of a turn (:func:`~selfcest_env.protocol.clip_action`),
    then normalised; the bounds follow the token limits, never the action's size.

    Strings keep ``chars_per_token * (tokens + 1)`` characters, more than ``tokens`` tokens of
    the counter can spell (:func:`~selfcest_env.tokens.chars_per_token`), so the cut changes no
    count: ``tokens`` is the turn's ``allowance`` for a turn charged by counting its text, and
    the ``context_window`` for a turn charged by its token ids (its text is not counted now, but
    it joins the context, which holds at most a window); never more than ``max_turn_chars``,
    the room the context's prompt leaves (:func:`~selfcest_env.prompts.turn_chars_left`).
    Token ids keep one more than the allowance, so that a longer turn is still truncated to it.
    """
    has_ids = getattr(action, "token_ids", None) is not None
    tokens = context_window if has_ids else allowance
    max_chars = max_turn_chars
    if tokens is not None:
        max_chars = min(max_chars, chars_per_token(counter) * (tokens + 1))
    max_ids = None if allowance is None else allowance + 1
    action, clipped = clip_action(action, max_chars, max_ids)
    turn = to_turn_input(action)
    return replace(turn, clipped=clipped or turn.clipped)


def valid_ids(token_ids: tuple[int, ...], counter: TokenCounter) -> bool:
    """Whether every id is a token of ``counter`` (``0 <= id < token_id_limit``); logs the
    first one that is not."""
    limit = token_id_limit(counter)
    bad = next((t for t in token_ids if not 0 <= t < limit), None)
    if bad is None:
        return True
    logger.warning(
        "token id %d is not in [0, %d): the turn's ids and logprobs are dropped and its text "
        "is counted instead; pass the ids the model sampled, from the env's tokenizer",
        bad,
        limit,
    )
    return False


@dataclass(frozen=True)
class ChargedTurn:
    """A turn as the ledger charges it: its text, token ids and logprobs (after truncation),
    the tokens charged, whether they were cut to the allowance (``cut``), and whether the turn
    counts as truncated (``cut``, or cut before by :func:`bounded_turn`)."""

    text: str
    token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None
    used: int
    cut: bool
    truncated: bool


def charge_turn(turn: TurnInput, allowance: int | None, counter: TokenCounter) -> ChargedTurn:
    """What ``turn`` costs under ``allowance`` (``None``: unlimited): its token ids when they are
    all tokens of ``counter`` (cut to the allowance, the text decoded from what is kept), else
    its text, counted and cut to the allowance."""
    text, token_ids, logprobs = turn.text, turn.token_ids, turn.logprobs
    if token_ids is not None and not valid_ids(token_ids[:allowance], counter):
        token_ids = logprobs = None
    cut = False
    if token_ids is not None:
        used = len(token_ids)
        if allowance is not None and used > allowance:
            token_ids = token_ids[:allowance]
            logprobs = None if logprobs is None else logprobs[:allowance]
            decode = getattr(counter, "decode_ids", None)
            text = decode(token_ids) if decode else counter.truncate_text(text, allowance)
            used, cut = allowance, True
    else:
        used = counter.count_text(text)
        if allowance is not None and used > allowance:
            text = counter.truncate_text(text, allowance)
            used, cut = min(counter.count_text(text), allowance), True
    return ChargedTurn(text, token_ids, logprobs, used, cut, cut or turn.clipped)
