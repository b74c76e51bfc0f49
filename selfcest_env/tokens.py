"""Token counting: exact with a Hugging Face tokenizer, deterministic offline otherwise.

The ledger charges every turn in tokens. :class:`TokenCounter` is the protocol it uses;
:class:`HFTokenCounter` wraps any Hugging Face tokenizer (exact counts, the model's chat
template); :class:`OfflineTokenCounter` needs nothing and is documented precisely so that its
counts can be computed by hand:

* a text is split into pieces by the regular expression ``\\w{1,4}|[^\\w\\s]|\\s{4}``: every run
  of up to four word characters is one token, every other non-space character is one token,
  and every four white-space characters in a row are one token (a run of white space costs
  ``len // 4``: up to three in a row are free, so ordinary spacing costs nothing);
* a chat prompt costs, per message, :attr:`OfflineTokenCounter.message_overhead` tokens (4) plus
  its content, plus :attr:`OfflineTokenCounter.generation_prompt` tokens (2) once for the
  assistant header that the next turn is generated after. A prompt whose last message is an
  assistant message *continues* that message (a fork child, or a parent after an inline join:
  :func:`continues_final_message`): the open message costs the generation prompt's 2 tokens
  plus its content, and no closing tokens. As token sequences (:meth:`OfflineTokenCounter.
  prompt_ids`): each message is an opening and a role token, its content's pieces, then a
  closing and a line-break token; the generation prompt is an opening and an ``assistant``
  token, so an open message reads exactly as a generation prompt followed by its text.

**Continuing the final message.** Every renderer of a prompt (the counters here, every backend,
the trainers) applies one rule: a chat that ends with an assistant message is rendered with
that message left open for the model to continue (``continue_final_message`` of Hugging Face
chat templates and of vLLM's server), any other chat with a generation prompt
(:func:`template_options`).

**Characters per token are bounded.** A text of ``T`` offline tokens has at most ``7 T + 3``
characters (at most 4 per piece, plus at most 3 free white-space characters before each
non-space piece and at the end), so a text of more than ``7 (T + 1)`` characters has more than
``T`` tokens. :func:`chars_per_token` gives that factor for any counter (the longest token for a
Hugging Face tokenizer); the environment cuts what an action carries to ``chars_per_token *
(T + 1)`` characters, ``T`` being the tokens the turn may cost, before it counts, parses or
stores anything, which leaves every count the same and bounds a step's work and memory by its
token limits instead of the action's size.

**Model text is plain text.** Text a model wrote never becomes a control token: counts encode
text with special-token parsing off (``<|im_start|>`` written by a model is several ordinary
tokens, as it would be in a prompt), and :func:`chat_token_ids` encodes a chat template's
rendering so that special tokens are parsed only where the template itself wrote them, never
inside a message's content. Every backend renders prompts with it, so the ledger's prompt counts
and the backends' prompts agree.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

Message = Mapping[str, Any]

_PIECE = re.compile(r"\w{1,4}|[^\w\s]|\s{4}")

#: The offline counter's message-structure tokens, as stand-in ids (negative: no text piece's
#: hash is meant to stand for them, and they read apart from the pieces in a debugger).
_OPEN, _CLOSE, _LINE_BREAK = -1, -2, -3

#: Characters per token assumed for a counter that does not state its own
#: ``max_chars_per_token`` (a custom counter): generous, so that a cut never changes a count of
#: ordinary text.
DEFAULT_CHARS_PER_TOKEN = 256

#: Token ids must lie below this when the counter knows no vocabulary (the offline counter):
#: ids that do not fit a signed 32-bit integer are no token of any tokenizer.
MAX_TOKEN_ID = 2**31

#: Marks where a message's content goes when :func:`chat_token_ids` renders the template's own
#: structure (private-use characters, which no template writes or rewrites).
_SLOT = re.compile("\ue000(\\d+)\ue001")

#: Inserted after the first character of special-token text in a message content when the chat
#: template rewrites contents (so that their place in the rendering is unknown): WORD JOINER,
#: invisible, so the text stays readable and can no longer be read as the special token.
_BREAK = "\u2060"


def continues_final_message(messages: Sequence[Message]) -> bool:
    """Whether a prompt of ``messages`` continues its last message (an assistant message)
    instead of opening a new turn with a generation prompt."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def template_options(messages: Sequence[Message]) -> dict[str, bool]:
    """The chat-template options that render ``messages`` as a prompt: ``continue_final_message``
    when the chat ends with an assistant message, else ``add_generation_prompt``."""
    if continues_final_message(messages):
        return {"continue_final_message": True, "add_generation_prompt": False}
    return {"add_generation_prompt": True}


@runtime_checkable
class TokenCounter(Protocol):
    """What the ledger needs to count tokens.

    A counter may also state ``max_chars_per_token`` (no text of ``T`` tokens is longer than
    ``max_chars_per_token * (T + 1)`` characters) and ``vocab_size`` (valid token ids are
    ``0 <= id < vocab_size``); see :func:`chars_per_token` and :func:`token_id_limit`. A counter
    with ``prompt_ids(messages)`` and ``text_ids(text)`` (token sequences whose lengths are the
    counts) lets the ledger find the prefixes prompts share (``uncached_prompt_tokens``); without
    them every prompt token counts as uncached.
    """

    def count_text(self, text: str) -> int:
        """Number of tokens in ``text`` as generated by the model (no special tokens)."""

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Number of prompt tokens for ``messages`` rendered with a generation prompt."""

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that counts at most ``max_tokens`` tokens."""


class OfflineTokenCounter:
    """Deterministic token counter that needs no tokenizer (see the module docstring)."""

    message_overhead: int = 4
    generation_prompt: int = 2
    #: A text of ``T`` tokens has at most ``7 T + 3 <= 7 (T + 1)`` characters.
    max_chars_per_token: int = 7

    def count_text(self, text: str) -> int:
        """Number of pieces of ``text``: runs of up to 4 word characters, other non-spaces, and
        each 4 white-space characters in a row."""
        return sum(1 for _ in _PIECE.finditer(text))

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Per message 4 tokens plus its content; 2 more for the generation prompt (an open
        final assistant message: 2 plus its content, see the module docstring)."""
        total = sum(
            self.message_overhead + self.count_text(str(message.get("content") or ""))
            for message in messages
        )
        if continues_final_message(messages):
            return total - self.message_overhead + self.generation_prompt
        return total + self.generation_prompt

    def text_ids(self, text: str) -> list[int]:
        """One stand-in id per piece of ``text`` (equal pieces, equal ids, within a process)."""
        return [hash(match.group()) for match in _PIECE.finditer(text)]

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The prompt of ``messages`` as stand-in ids, ``count_messages(messages)`` of them (see
        the module docstring for the layout)."""
        ids: list[int] = []
        open_last = continues_final_message(messages)
        for number, message in enumerate(messages):
            ids += [_OPEN, hash(str(message.get("role")))]
            ids += self.text_ids(str(message.get("content") or ""))
            if not (open_last and number == len(messages) - 1):
                ids += [_CLOSE, _LINE_BREAK]
        if not open_last:
            ids += [_OPEN, hash("assistant")]
        return ids

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """Cut ``text`` right after its ``max_tokens``-th piece."""
        if max_tokens <= 0:
            return ""
        for count, match in enumerate(_PIECE.finditer(text), start=1):
            if count == max_tokens:
                return text[: match.end()]
        return text


class HFTokenCounter:
    """Exact counts with a Hugging Face tokenizer and, when it has one, its chat template.

    Texts are encoded as plain text (:func:`plain_token_ids`) and prompts with
    :func:`chat_token_ids`, so that text a model wrote counts as the ordinary tokens it is.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._has_template = bool(getattr(tokenizer, "chat_template", None))

    @cached_property
    def max_chars_per_token(self) -> int:
        """The longest token's spelling in the vocabulary, plus one (for the space a decoder may
        put between tokens); byte-level spellings are at least as long as their text."""
        return 1 + max((len(token) for token in self.tokenizer.get_vocab()), default=0)

    @cached_property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text (no special tokens added or parsed)."""
        return plain_token_ids(self.tokenizer, text)

    def count_text(self, text: str) -> int:
        """Number of token ids of ``text`` as plain text."""
        return len(self.encode(text))

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Length of the chat template's rendering as a prompt (:func:`template_options`,
        :func:`chat_token_ids`)."""
        return len(self.prompt_ids(messages))

    def text_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text (:meth:`encode`)."""
        return self.encode(text)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the chat template's rendering of ``messages`` as a prompt; without a
        template, ``role: content`` lines as plain text."""
        plain = [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages]
        if self._has_template:
            return chat_token_ids(self.tokenizer, plain, self._render)
        lines = [f"{m['role']}: {m['content']}\n" for m in plain]
        if continues_final_message(plain):
            lines[-1] = lines[-1].removesuffix("\n")
        return [token for line in lines for token in self.encode(line)]

    def _render(self, messages: list[dict[str, Any]]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, **template_options(messages)
        )

    def decode_ids(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (special tokens dropped)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """Decode the first ``max_tokens`` token ids of ``text``."""
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text
        return self.tokenizer.decode(ids[: max(0, max_tokens)])


def as_token_counter(tokenizer: Any | None) -> TokenCounter:
    """A :class:`TokenCounter` for ``tokenizer``: offline when ``None``, wrapped when it is a
    Hugging Face tokenizer, itself when it already implements the protocol."""
    if tokenizer is None:
        return OfflineTokenCounter()
    if isinstance(tokenizer, TokenCounter):
        return tokenizer
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode"):
        return HFTokenCounter(tokenizer)
    raise TypeError(
        f"cannot count tokens with {type(tokenizer).__name__}: pass a Hugging Face tokenizer, "
        "an object with count_text/count_messages/truncate_text, or None for the offline counter"
    )


def chars_per_token(counter: TokenCounter) -> int:
    """No text of ``T`` tokens of ``counter`` is longer than ``chars_per_token(counter) * (T + 1)``
    characters: the counter's ``max_chars_per_token``, else :data:`DEFAULT_CHARS_PER_TOKEN`."""
    return int(getattr(counter, "max_chars_per_token", DEFAULT_CHARS_PER_TOKEN))


def token_id_limit(counter: TokenCounter) -> int:
    """Valid token ids are ``0 <= id < token_id_limit(counter)``: the counter's ``vocab_size``,
    else :data:`MAX_TOKEN_ID`."""
    return int(getattr(counter, "vocab_size", MAX_TOKEN_ID))


def plain_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text: no special tokens added, and special-token text
    (``<|im_start|>``) encoded as the ordinary tokens that spell it."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """``{text: id}`` of the tokenizer's special tokens (its special added tokens and the
    ``all_special_tokens`` it names), the tokens that a text must never turn into."""
    names = {
        str(token)
        for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(token, "special", False)
    }
    names.update(str(token) for token in getattr(tokenizer, "all_special_tokens", ()))
    names.discard("")
    return {name: int(tokenizer.convert_tokens_to_ids(name)) for name in names}


def chat_token_ids(
    tokenizer: Any,
    messages: Sequence[Message],
    render: Callable[[list[dict[str, Any]]], str],
    start: int = 0,
) -> list[int]:
    """Token ids of ``render(messages)`` (a chat template's rendering) in which special tokens are
    parsed where the template wrote them and nowhere inside a message's content; with ``start``,
    of the rendering from that character on (a trainer's ids between two turns).

    The template is rendered a second time with a placeholder in place of each content, which
    locates every content in the rendering. When no special-token text lies in a content, the
    rendering is encoded as a whole, exactly as before; otherwise the text between the
    template's own special tokens is encoded as plain text (:func:`plain_token_ids`), the
    tokenizer's own rule for the stretches between special tokens. A template that rewrites
    contents (so that they cannot be located) gets contents whose special-token text is broken
    by an invisible WORD JOINER instead, with a warning (from ``start`` on, where the broken
    rendering has no known offset, the rendering is encoded as plain text).
    """
    rendered = render([dict(m) for m in messages])
    specials = special_tokens(tokenizer)
    if not specials:
        return plain_token_ids(tokenizer, rendered[start:])
    pattern = _alternation(specials)
    found = list(pattern.finditer(rendered, start))
    spans = _content_spans(messages, render, rendered) if found else []
    if spans is None:
        logger.warning(
            "the chat template rewrites message contents, so special-token text in them is "
            "broken with U+2060 instead of being encoded as plain text"
        )
        if start:
            return plain_token_ids(tokenizer, rendered[start:])
        safe = [_broken(dict(m), pattern) for m in messages]
        return list(tokenizer.encode(render(safe), add_special_tokens=False))
    starts = [begin for begin, _ in spans]
    own = [match for match in found if not _inside(match, spans, starts)]
    if len(own) == len(found):
        return list(tokenizer.encode(rendered[start:], add_special_tokens=False))
    ids: list[int] = []
    position = start
    for match in own:
        ids += plain_token_ids(tokenizer, rendered[position : match.start()])
        ids.append(specials[match.group()])
        position = match.end()
    return ids + plain_token_ids(tokenizer, rendered[position:])


def _alternation(specials: Mapping[str, int]) -> re.Pattern[str]:
    """A regex of the special tokens, longest first (the tokenizer's leftmost-longest match)."""
    return re.compile("|".join(re.escape(name) for name in sorted(specials, key=len, reverse=True)))


def _content_spans(
    messages: Sequence[Message],
    render: Callable[[list[dict[str, Any]]], str],
    rendered: str,
) -> list[tuple[int, int]] | None:
    """Where each string content lies in ``rendered`` (in order), or ``None`` when the template
    does not write contents verbatim (or stripped, as some templates do)."""
    contents = [m.get("content") for m in messages]
    slots = [
        {**m, "content": f"\ue000{i}\ue001"} if isinstance(contents[i], str) else dict(m)
        for i, m in enumerate(messages)
    ]
    parts = _SLOT.split(render(slots))  # template text, slot index, template text, ...
    spans: list[tuple[int, int]] = []
    position = 0
    for index in range(0, len(parts), 2):
        if not rendered.startswith(parts[index], position):
            return None
        position += len(parts[index])
        if index + 1 == len(parts):
            break
        content = contents[int(parts[index + 1])]
        following = parts[index + 2]
        for form in dict.fromkeys((content, content.strip())):
            end = position + len(form)
            if rendered.startswith(form, position) and rendered.startswith(following, end):
                spans.append((position, end))
                position = end
                break
        else:
            return None
    return spans if position == len(rendered) else None


def _inside(match: re.Match[str], spans: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether ``match`` overlaps a content span (``spans`` sorted, ``starts`` their starts)."""
    index = max(bisect.bisect_right(starts, match.start()) - 1, 0)
    while index < len(spans) and spans[index][0] < match.end():
        if match.start() < spans[index][1]:
            return True
        index += 1
    return False


def _broken(message: dict[str, Any], pattern: re.Pattern[str]) -> dict[str, Any]:
    """``message`` with each special-token text in its content broken after its first
    character."""
    content = message.get("content")
    if isinstance(content, str):
        message["content"] = pattern.sub(lambda m: m.group()[0] + _BREAK + m.group()[1:], content)
    return message
