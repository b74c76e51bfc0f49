"""The prompts the environment writes: system prompts, the tool schema, clone and tool messages.

All of them are plain data in :class:`PromptConfig`, so an experiment can change the wording
without touching the environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from selfcest_env.protocol import TOOL_NAME

ROOT_SYSTEM_PROMPT = (
    "You solve problems and may delegate parts of them to clones of yourself.\n"
    "To delegate, call the tool spawn_clone: write\n"
    '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["first sub-task", '
    '"second sub-task"], "shared_context": ["context key", ...]}}</tool_call>\n'
    "Each objective starts one clone with a fresh, empty context: it sees only its objective "
    "and the context keys you pass, so write objectives that stand on their own. Clones work "
    "in parallel; their answers come back as one line each, labelled turn<t>_clone<i>.\n"
    "Every generated token costs reward: delegate when it saves work, answer directly when "
    "it does not. When you are done, write your final answer after 'Answer:'."
)

PLAIN_SYSTEM_PROMPT = (
    "Solve the problem. Reason briefly, then write your final answer after 'Answer:'."
)

CLONE_SYSTEM_PROMPT = (
    "You are a helper clone: a copy of the agent that asked for your help, started with a "
    "fresh context. Work only on your objective, use only the context you are given, conserve "
    "tokens, and finish with a concise final answer after 'Answer:'."
)

CLONE_SPAWN_NOTE = (
    "You may delegate further with the spawn_clone tool, in the same format: "
    '<tool_call>{"name": "spawn_clone", "arguments": {"objectives": ["..."]}}</tool_call>'
)


FORK_HEADER = (
    "You are {label}, a fork of this context: what came before is yours too. Work only on "
    "this objective and finish with a concise final answer after 'Answer:'.\nObjective: "
    "{objective}"
)


def spawn_clone_schema() -> dict[str, Any]:
    """The ``spawn_clone`` tool in the JSON-schema form that chat templates accept."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Start one clone of yourself per objective; each returns a short "
            "answer.",
            "parameters": {
                "type": "object",
                "properties": {
                    "objectives": {
                        "type": "array",
                        "description": "One self-contained instruction per clone, or an object "
                        "with 'instruction', optional 'name' and 'shared_context'.",
                        "items": {"type": ["string", "object"]},
                    },
                    "shared_context": {
                        "type": "array",
                        "description": "Context keys every clone receives.",
                        "items": {"type": "string"},
                    },
                },
                "required": ["objectives"],
            },
        },
    }


@dataclass(frozen=True)
class PromptConfig:
    """Wording of the prompts and the truncation of what clones send back.

    Attributes:
        root_system: System prompt of a root that may spawn.
        plain_system: System prompt of a root that may not spawn (``max_depth=0``).
        clone_system: System prompt of every clone.
        clone_spawn_note: Appended to a clone's system prompt when it may spawn in turn.
        fork_header: The tool message a fork child of a ``spawn_clone`` call reads after its
            copy of the parent's context (``{label}`` and ``{objective}`` are filled in).
        answer_chars: Characters of each clone answer kept in the tool message.
        message_chars: Characters of the whole tool message kept.
    """

    root_system: str = ROOT_SYSTEM_PROMPT
    plain_system: str = PLAIN_SYSTEM_PROMPT
    clone_system: str = CLONE_SYSTEM_PROMPT
    clone_spawn_note: str = CLONE_SPAWN_NOTE
    fork_header: str = FORK_HEADER
    answer_chars: int = 256
    message_chars: int = 512

    def with_room_for(self, answers: int, turns: int = 1) -> PromptConfig:
        """This configuration with ``message_chars`` raised (never lowered) so that a tool
        message of ``answers`` full-length answer lines, labelled up to ``turn<turns>``, is
        never cut: for agents whose program reads every clone's answer (a vote, a search)."""
        line = len(f"turn{turns}_clone{answers}: ") + self.answer_chars + 1
        return replace(self, message_chars=max(self.message_chars, answers * line))


def render_paragraphs(keys: Sequence[str], paragraphs: Mapping[str, str]) -> str:
    """``[title]`` blocks for ``keys`` (which must all be in ``paragraphs``)."""
    return "\n\n".join(f"[{key}]\n{paragraphs[key]}" for key in keys)


def root_user_message(
    prompt: str, paragraphs: Mapping[str, str], root_view: str, may_spawn: bool
) -> str:
    """The root's first user message for a task.

    With ``root_view="keys"`` (and a task that has context) the root sees the list of context
    keys; with ``"full"`` every paragraph is put into its own context.
    """
    if not paragraphs:
        return prompt
    if root_view == "full" or not may_spawn:
        return f"{render_paragraphs(list(paragraphs), paragraphs)}\n\nQuestion: {prompt}"
    keys = "\n".join(f"- {key}" for key in paragraphs)
    return (
        f"Question: {prompt}\n\nContext keys (pass them to clones in shared_context; you cannot "
        f"read the paragraphs yourself):\n{keys}"
    )


def clone_user_message(
    instruction: str, keys: Sequence[str], paragraphs: Mapping[str, str]
) -> tuple[str, int]:
    """A clone's first user message and the number of requested keys that do not exist."""
    found = [key for key in keys if key in paragraphs]
    missing = [key for key in keys if key not in paragraphs]
    parts = [f"Objective: {instruction}"]
    if found:
        parts.append(f"Context:\n{render_paragraphs(found, paragraphs)}")
    if missing:
        parts.append("Missing context keys (not found): " + ", ".join(missing))
    return "\n\n".join(parts), len(missing)


def tool_message(lines: Sequence[str], config: PromptConfig) -> str:
    """Join ``label: answer`` lines, truncating the whole message to ``config.message_chars``."""
    text = "\n".join(lines)
    if len(text) > config.message_chars:
        text = text[: config.message_chars - 3] + "..."
    return text


def fork_message(label: str, objective: str, config: PromptConfig) -> str:
    """The tool message that starts a fork child of a ``spawn_clone`` call: ``config.
    fork_header`` with its ``{label}`` and ``{objective}`` filled in (plain replacement, so any
    other braces in a custom header stay as written)."""
    return config.fork_header.replace("{label}", label).replace("{objective}", objective)


def answer_line(label: str, answer: str, config: PromptConfig) -> str:
    """One ``label: answer`` line with the answer truncated to ``config.answer_chars``."""
    answer = " ".join(answer.split())
    if len(answer) > config.answer_chars:
        answer = answer[: config.answer_chars - 3] + "..."
    return f"{label}: {answer}"


#: Opens the header line of each message in :func:`render_messages`, and nothing else there;
#: inside a message it is written :data:`_HEADER_OPEN_ESCAPED`.
_HEADER_OPEN = "<|"
_HEADER_OPEN_ESCAPED = "<\\|"


def render_messages(messages: list[dict[str, str]]) -> str:
    """The plain-text prompt of a context: a ``<|role|>`` header line before each message.

    Only the headers contain ``<|``: inside a message it is written ``<\\|``, so that text a
    model wrote (a clone's answer, an objective) can neither forge a header line (``<|system|>``)
    nor spell a ``<|...|>`` special token (``<|im_start|>``).
    """
    return "\n".join(
        f"{_HEADER_OPEN}{m['role']}|>\n{m['content'].replace(_HEADER_OPEN, _HEADER_OPEN_ESCAPED)}"
        for m in messages
    )


#: What :func:`render_messages` adds before an assistant turn: the newline and its header line.
_TURN_HEADER_CHARS = len(f"\n{_HEADER_OPEN}assistant|>\n")


def turn_chars_left(prompt_chars: int, max_prompt_chars: int) -> int:
    """The most characters a turn may have so that a rendered prompt of ``prompt_chars``
    characters, with the turn appended, stays within ``max_prompt_chars`` (0: no room).

    A turn's character renders as at most 1.5 (``<|`` is written ``<\\|``), after its header.
    """
    return max(0, (max_prompt_chars - prompt_chars - _TURN_HEADER_CHARS) * 2 // 3)
