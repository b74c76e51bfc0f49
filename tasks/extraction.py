"""The answer-extraction contract: what the final answer of a model's turn is.

One reading, used by the environment (what a context returns to its parent, what the root's
episode is graded on) and by every grader (math, arithmetic, Countdown, QA), so that an answer
graded through ``env.step`` and the same reply graded directly get the same score.
:func:`final_answer` reads a reply in this order (the first rule that applies wins):

0. **Scope.** Only the text after the last ``</think>`` counts when there is one.
1. **Box group.** The last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) together with the
   boxes right before it that are joined to it only by connectors (white space, math
   delimiters, commas, semicolons, ``and``, ``or``, ``\\quad``): MATH's convention and
   math-verify's, which reads ``\\boxed{1} and \\boxed{2}`` as the set of both. The contents are
   joined by ``", "``, so a hedge ``\\boxed{41} or \\boxed{42}`` reads as the list ``41, 42``,
   never as ``42``.
2. **Answer marker.** The last ``Answer:`` (any case, ``Final Answer:``, ``**Answer:**``,
   ``Answer**:``, ``Answers:``, a full-width colon) or ``answer is`` (``The final answer is``):
   the rest of that line, or the next non-empty line when the rest is empty; a display block
   (``\\[`` or ``$$``) opened there runs to its closing delimiter. Text on later lines (an
   explanation after the answer line) is not part of the answer, nor is the closing sentence
   of the Minerva prompt format, "I hope it is correct.".
3. **GSM8K marker.** The rest of the line after the last ``####``.
4. **Last line.** Else the last non-empty line; when it closes a display block (``\\]`` or
   ``$$``), the whole block.

The answer is then put on one line (line breaks become spaces) and cleaned: surrounding white
space, Markdown emphasis, one pair of enclosing math delimiters (``$``, ``$$``, ``\\(``,
``\\[``) and a final full stop are removed. Extraction is applied again to its own result until
nothing changes (``Answer: #### 5`` reads ``5``), so it is idempotent: the answer a context
returned, extracted again by a grader, is the same answer.

An answer longer than :data:`MAX_ANSWER_CHARS` characters is **too long**: graders score it 0
with a reason instead of grading a fragment of it.

Every step is linear in the length of the reply (no backtracking regular expression runs over
model text), so a hostile reply of any size is read in time proportional to its size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_ANSWER_CHARS",
    "FinalAnswer",
    "final_answer",
    "gsm8k_answer",
    "is_hedge",
    "last_box",
]

#: Longest final answer, in characters, that graders accept (longer ones score 0 with a reason).
MAX_ANSWER_CHARS = 1000

_THINK_END = "</think>"
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_WORD = re.compile(r"answers?", re.IGNORECASE)
_GSM8K_MARKER = "####"
#: Longest run of connector text between two boxes of one group.
_MAX_GAP = 40
_CONNECTOR = re.compile(
    r"(?:\s|\$|\\[()\[\]]|[,;&]|\\q?quad|\\text\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b)*",
    re.IGNORECASE,
)
_EMPHASIS = "*_"
_MINERVA_TAIL = "i hope it is correct"
_NOT_CONTENT = frozenset(",.;$\\()")
_HEDGE_WORD = re.compile(r"\b(?:or|either)\b", re.IGNORECASE)
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
#: How many times extraction is re-applied to its own result, at most.
_MAX_PASSES = 6

How = Literal["boxed", "marker", "gsm8k", "line", "empty"]


@dataclass(frozen=True)
class FinalAnswer:
    """The final answer of a reply and how it was found.

    Attributes:
        text: The answer on one line, cleaned (see the module docstring).
        how: The rule that found it: ``"boxed"``, ``"marker"`` (``Answer:`` / ``answer is``),
            ``"gsm8k"`` (``####``), ``"line"`` (the last line: no marker of any kind) or
            ``"empty"`` (nothing at all).
    """

    text: str
    how: How

    @property
    def marked(self) -> bool:
        """Whether an explicit marker (a box, ``Answer:``, ``####``) introduced the answer."""
        return self.how in ("boxed", "marker", "gsm8k")

    @property
    def too_long(self) -> bool:
        """Whether the answer is longer than :data:`MAX_ANSWER_CHARS` (graded 0)."""
        return len(self.text) > MAX_ANSWER_CHARS


def final_answer(reply: str) -> FinalAnswer:
    """The final answer of ``reply`` under the contract of this module's docstring."""
    found = _extract_once(reply)
    how = found.how
    text = found.text
    for _ in range(_MAX_PASSES):
        again = _extract_once(text)
        if again.text == text:
            break
        text = again.text
    return FinalAnswer(text, how if text else "empty")


def _extract_once(reply: str) -> FinalAnswer:
    scope = reply.rsplit(_THINK_END, 1)[1] if _THINK_END in reply else reply
    boxes = _box_group(scope)
    if boxes is not None:
        return FinalAnswer(", ".join(_clean(b) for b in boxes), "boxed")
    marked = _after_last_marker(scope)
    if marked is not None:
        return FinalAnswer(_clean(marked), "marker")
    gsm = gsm8k_answer(scope)
    if gsm is not None:
        return FinalAnswer(_clean(gsm), "gsm8k")
    line = _last_line(scope)
    return FinalAnswer(_clean(line), "line" if line.strip() else "empty")


# --------------------------------------------------------------------------------------------
# Boxes
# --------------------------------------------------------------------------------------------


def _matching_braces(text: str, start: int) -> dict[int, int]:
    """``{open index: close index}`` for every brace pair from ``start`` on (one pass; escaped
    braces ``\\{`` ``\\}`` are not braces; an unclosed brace has no entry)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_OR_ESCAPE.finditer(text, start):
        c = m.group(0)
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _boxes(text: str) -> list[tuple[int, int, int, int]]:
    """Every outermost box in ``text`` as ``(start, end, content start, content end)``, in
    order. An unclosed box runs to the end of the text; ``\\boxed 5`` holds the next run of
    non-space characters; a box inside another box's content belongs to that box."""
    commands = list(_BOX_COMMAND.finditer(text))
    if not commands:
        return []
    pairs = _matching_braces(text, commands[0].start())
    boxes: list[tuple[int, int, int, int]] = []
    for m in commands:
        if boxes and m.start() < boxes[-1][1]:
            continue
        position = m.end()
        while position < len(text) and text[position] in " \t":
            position += 1
        if position < len(text) and text[position] == "{":
            close = pairs.get(position)
            if close is None:
                boxes.append((m.start(), len(text), position + 1, len(text)))
            else:
                boxes.append((m.start(), close + 1, position + 1, close))
        elif position > m.end():
            word = position
            while word < len(text) and not text[word].isspace() and text[word] != "$":
                word += 1
            if word > position:
                boxes.append((m.start(), word, position, word))
    return boxes


def _box_group(text: str) -> list[str] | None:
    """The contents of the last box group (see rule 1), or ``None`` when there is no box."""
    boxes = _boxes(text)
    if not boxes:
        return None
    group = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        gap_start, gap_end = box[1], group[-1][0]
        if gap_end - gap_start > _MAX_GAP or not _CONNECTOR.fullmatch(text, gap_start, gap_end):
            break
        group.append(box)
    return [text[c_start:c_end] for _, _, c_start, c_end in reversed(group)]


def last_box(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces and all), stripped;
    ``None`` when there is none. How the MATH dataset marks its gold answers."""
    boxes = _boxes(text)
    return text[boxes[-1][2] : boxes[-1][3]].strip() if boxes else None


# --------------------------------------------------------------------------------------------
# Markers and lines
# --------------------------------------------------------------------------------------------


def _marker_end(text: str, word_end: int) -> int | None:
    """Where the answer starts when the word ``answer`` ending at ``word_end`` is a marker
    (followed by emphasis and a colon, or by the word ``is``), else ``None``."""
    i = word_end
    n = len(text)
    while i < n and text[i] in _EMPHASIS:
        i += 1
    while i < n and text[i] in " \t":
        i += 1
    while i < n and text[i] in _EMPHASIS:
        i += 1
    if i < n and text[i] in ":：":
        i += 1
        while i < n and text[i] in _EMPHASIS:
            i += 1
        return i
    if text.startswith(("is", "IS", "Is"), i) and (i + 2 == n or not text[i + 2].isalnum()):
        i += 2
        if i < n and text[i] in ":：":
            i += 1
        return i
    return None


def _after_last_marker(text: str) -> str | None:
    """The answer after the last answer marker (rule 2), or ``None`` when there is none."""
    start = None
    for m in _ANSWER_WORD.finditer(text):
        if m.start() > 0 and text[m.start() - 1].isalnum():
            continue
        end = _marker_end(text, m.end())
        if end is not None:
            start = end
    if start is None:
        return None
    line_end = text.find("\n", start)
    line = text[start:] if line_end < 0 else text[start:line_end]
    if not line.strip(" \t" + _EMPHASIS) and line_end >= 0:
        rest = text[line_end + 1 :]
        following = _first_nonempty_line_start(rest)
        if following is None:
            return ""
        start = line_end + 1 + following
        line_end = text.find("\n", start)
        line = text[start:] if line_end < 0 else text[start:line_end]
    return _without_minerva_tail(_extend_display(text, start, line))


def _without_minerva_tail(answer: str) -> str:
    """``answer`` without a closing "I hope it is correct." (the Minerva prompt's last words)."""
    body = answer.rstrip().removesuffix(".").rstrip()
    if body.lower().endswith(_MINERVA_TAIL):
        return body[: -len(_MINERVA_TAIL)]
    return answer


def _first_nonempty_line_start(text: str) -> int | None:
    position = 0
    while position < len(text):
        end = text.find("\n", position)
        end = len(text) if end < 0 else end
        if text[position:end].strip():
            return position
        position = end + 1
    return None


def _extend_display(text: str, start: int, line: str) -> str:
    """``line`` (which starts at ``start`` in ``text``), run on to the end of a display block
    (``\\[ ... \\]`` or ``$$ ... $$``) that it opens but does not close."""
    stripped = line.strip()
    for opening, closing in (("\\[", "\\]"), ("$$", "$$")):
        if stripped.startswith(opening) and closing not in stripped[len(opening) :]:
            begin = start + line.index(opening) + len(opening)
            close = text.find(closing, begin)
            if close >= 0:
                return text[start : close + len(closing)]
    return line


def gsm8k_answer(text: str) -> str | None:
    """The rest of the line after the last GSM8K ``####`` marker (commas kept), or ``None``."""
    position = text.rfind(_GSM8K_MARKER)
    if position < 0:
        return None
    rest = text[position + len(_GSM8K_MARKER) :]
    line_end = rest.find("\n")
    return (rest if line_end < 0 else rest[:line_end]).strip()


def _last_line(text: str) -> str:
    """The last non-empty line (rule 4); the whole display block when that line closes one."""
    body = text.rstrip()
    line_start = body.rfind("\n") + 1
    line = body[line_start:].strip()
    for opening, closing in (("\\[", "\\]"), ("$$", "$$")):
        if line.endswith(closing) and opening not in line[: -len(closing)]:
            begin = body.rfind(opening, 0, line_start)
            if begin >= 0:
                return body[begin:]
    return line


def _clean(text: str) -> str:
    """One line, without surrounding white space, emphasis, math delimiters or final stop."""
    s = " ".join(text.split()) if "\n" in text or "\r" in text else text.strip()
    for _ in range(4):
        before = s
        s = s.strip(" \t" + _EMPHASIS)
        if s.endswith(".") and not s.endswith(".."):
            s = s[:-1].rstrip()
        for opening, closing in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
            if (
                len(s) >= len(opening) + len(closing)
                and s.startswith(opening)
                and s.endswith(closing)
                and not s.endswith("\\" + closing)
                and opening not in s[len(opening) : len(s) - len(closing)]
            ):
                s = s[len(opening) : len(s) - len(closing)].strip()
                break
        if s == before:
            break
    return s


# --------------------------------------------------------------------------------------------
# Hedges
# --------------------------------------------------------------------------------------------


def is_hedge(answer: str) -> bool:
    """Whether a final answer offers alternatives: the word ``or`` between two parts that both
    hold something, or ``either`` before something (``41 or 42``, ``$x=1$ or $x=2$``,
    ``either Paris or Lyon``, ``\\text{ or }`` included). Graders score a hedge 0 unless the
    gold answer itself offers alternatives."""
    plain = _TEXT_COMMAND.sub(r" \1 ", answer)
    content = [i for i, c in enumerate(plain) if not c.isspace() and c not in _NOT_CONTENT]
    if not content:
        return False
    first, last = content[0], content[-1]
    for m in _HEDGE_WORD.finditer(plain):
        holds_after = last >= m.end()
        if holds_after and (m.group(0).lower() == "either" or first < m.start()):
            return True
    return False
