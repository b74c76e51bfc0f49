"""Audit of the token counts a backend reports against the ledger's own.

Audits of other benchmarks found providers' usage counts far off what the transcripts hold. The
ledger counts every turn itself and stays the source of truth; when a backend reports what a
request cost (an OpenAI-compatible server's ``usage``: prompt and completion tokens), the env
keeps that beside the ledger's counts of the same turn (``reported_usage`` of the turn in the
trace). This module sums both per episode (``info["usage_audit"]``, an episode record's
``usage_audit``) and per run (``stats.json``), with the number of turns on which they disagree:

* ``turns``: turns with a reported usage;
* ``prompt_mismatches`` / ``completion_mismatches``: of those, turns whose reported prompt /
  completion tokens differ from the ledger's (the turn's ``prompt_tokens`` / ``gen_tokens``);
* ``prompt_tokens_reported`` / ``prompt_tokens_ledger`` and ``completion_tokens_reported`` /
  ``completion_tokens_ledger``: the sums of both over those turns.

A systematic difference (a server that counts the end-of-sequence token, a chat template that
adds a token the ledger's rendering does not) shows as a mismatch on every turn with a constant
difference per turn; a provider that bills far more shows in the sums.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from selfcest_env.protocol import ReportedUsage
from selfcest_env.trace import EpisodeTrace, as_episode_trace
from selfcest_env.tracereader import is_count

#: The counts of an audit, in order.
AUDIT_KEYS: tuple[str, ...] = (
    "turns",
    "prompt_mismatches",
    "completion_mismatches",
    "prompt_tokens_reported",
    "prompt_tokens_ledger",
    "completion_tokens_reported",
    "completion_tokens_ledger",
)


class AuditedTurn(Protocol):
    """What the audit reads of a turn (a trace's :class:`~selfcest_env.trace.TurnTrace`, the
    env's own turn records)."""

    prompt_tokens: int
    gen_tokens: int
    reported_usage: ReportedUsage | None


def audit_trace(trace: EpisodeTrace | Mapping[str, Any]) -> dict[str, int] | None:
    """The audit of one episode's trace; ``None`` when no turn has a reported usage."""
    return audit_turns(
        turn for context in as_episode_trace(trace).contexts for turn in context.turns
    )


def audit_turns(turns: Iterable[AuditedTurn]) -> dict[str, int] | None:
    """The audit of ``turns``; ``None`` when none has a reported usage."""
    audit = dict.fromkeys(AUDIT_KEYS, 0)
    for turn in turns:
        usage = turn.reported_usage
        if usage is None:
            continue
        audit["turns"] += 1
        audit["prompt_mismatches"] += usage.prompt_tokens != turn.prompt_tokens
        audit["completion_mismatches"] += usage.completion_tokens != turn.gen_tokens
        audit["prompt_tokens_reported"] += usage.prompt_tokens
        audit["prompt_tokens_ledger"] += turn.prompt_tokens
        audit["completion_tokens_reported"] += usage.completion_tokens
        audit["completion_tokens_ledger"] += turn.gen_tokens
    return audit if audit["turns"] else None


def audit_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as an audit (a dict of every :data:`AUDIT_KEYS` count and
    nothing else), or ``None`` when it is one."""
    if not isinstance(value, Mapping):
        return f"must be a dict of counts, got {type(value).__name__}"
    if set(value) != set(AUDIT_KEYS):
        return f"must hold exactly {', '.join(AUDIT_KEYS)}"
    bad = next((key for key in AUDIT_KEYS if not is_count(value[key])), None)
    if bad is not None:
        return f"{bad} must be a count, got {value[bad]!r}"
    return None


def add_audits(audits: Iterable[Mapping[str, int] | None]) -> dict[str, int] | None:
    """The sum of episode audits (``None`` ones skipped); ``None`` when there is none."""
    present = [audit for audit in audits if audit is not None]
    if not present:
        return None
    return {key: sum(int(audit[key]) for audit in present) for key in AUDIT_KEYS}


def describe_audit(audit: Mapping[str, int]) -> str | None:
    """One line on how the reported usage disagrees with the ledger, or ``None`` when it
    agrees on every turn."""
    if not (audit["prompt_mismatches"] or audit["completion_mismatches"]):
        return None
    parts = []
    for kind in ("prompt", "completion"):
        reported, ledger = audit[f"{kind}_tokens_reported"], audit[f"{kind}_tokens_ledger"]
        parts.append(
            f"{kind} tokens differ on {audit[f'{kind}_mismatches']} of {audit['turns']} turns "
            f"(reported {reported:,}, ledger {ledger:,}, {reported - ledger:+,})"
        )
    return "the backend's reported usage disagrees with the ledger: " + "; ".join(parts)
