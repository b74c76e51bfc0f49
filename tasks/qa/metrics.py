"""SQuAD / HotpotQA-style answer metrics: normalisation, exact match and token F1.

:func:`normalize_answer` follows the official SQuAD v1.1 and HotpotQA evaluation scripts, in the
same order: lower case, delete punctuation, replace the articles ``a`` / ``an`` / ``the`` by a
space, collapse white space. Unicode handling, decided here and kept close to the official
scripts:

* case: ``str.lower()`` only (not ``casefold``: ``"ß"`` stays ``"ß"``), as the official scripts;
* accents are kept (``"Café"`` does not match ``"Cafe"``): stripping them (NFKD plus dropping
  combining marks) is not part of the standard metric;
* the text is first put into Unicode NFC form, so that a precomposed ``"é"`` and ``"e"`` plus a
  combining acute accent compare equal; this never changes how a string looks;
* punctuation is every character of ``string.punctuation`` (the official set, which includes the
  ASCII symbols ``$ + < = > ^ ` | ~``) plus every Unicode character whose general category is
  punctuation (``P*``: curly quotes, dashes, ``¿``, ``«»``, ``。`` ...). Other Unicode symbols
  (``€``, ``°``, ``©``; category ``S*``) are kept. Punctuation is deleted, not replaced by a
  space, as in the official scripts (``"well-known"`` becomes ``"wellknown"``);
* white space is any Unicode white space (``str.split()``).

:func:`f1` follows HotpotQA: a prediction or gold of ``yes`` / ``no`` / ``noanswer`` (after
normalisation) scores 0 unless it equals the other side; when either side normalises to no tokens
the score is 1 if both do, else 0 (the SQuAD v2 rule). Both metrics take the maximum over all gold
aliases.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

from ..base import Grade
from ..extraction import final_answer, is_hedge

__all__ = [
    "CONTAINS_MAX_WORDS",
    "MATCH_MODES",
    "contains_match",
    "exact_match",
    "f1",
    "f1_precision_recall",
    "grade_qa",
    "graded_text",
    "normalize_answer",
    "qa_answer_key",
]

_ASCII_PUNCT = frozenset(string.punctuation)
_DROP_ASCII = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop articles, collapse white space (see module docs)."""
    if text.isascii():
        text = text.lower().translate(_DROP_ASCII)
    else:
        text = unicodedata.normalize("NFC", text).lower()
        text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    items = [golds] if isinstance(golds, str) else [str(g) for g in golds]
    if not items:
        raise ValueError("need at least one gold answer")
    return items


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if ``prediction`` normalises to the same string as any gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def f1_precision_recall(prediction: str, gold: str) -> tuple[float, float, float]:
    """Token-level ``(f1, precision, recall)`` of ``prediction`` against one ``gold`` answer."""
    pred = normalize_answer(prediction)
    ref = normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0, 0.0, 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    if not pred_tokens or not ref_tokens:
        same = float(pred_tokens == ref_tokens)
        return same, same, same
    common = Counter(pred_tokens) & Counter(ref_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0, 0.0, 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1(prediction: str, golds: str | Iterable[str]) -> float:
    """The largest token F1 of ``prediction`` against any gold answer."""
    return max(f1_precision_recall(prediction, g)[0] for g in _golds(golds))


def graded_text(answer: str) -> str:
    """The part of ``answer`` that :func:`grade_qa` grades: its final answer under the
    extraction contract (:func:`~selfcest_env.tasks.extraction.final_answer`: the ``Answer:``
    line, any case, not the explanation after it; else the last line)."""
    return final_answer(answer).text


def qa_answer_key(answer: str) -> str | None:
    """``answer`` as :func:`grade_qa` compares it: its graded text, normalised (``None`` when
    that is empty). Answers with equal keys get the same grade in either match mode."""
    return normalize_answer(graded_text(answer)) or None


#: Longest answer, in normalised words, that :func:`contains_match` accepts.
CONTAINS_MAX_WORDS = 12

#: How :func:`grade_qa` scores: ``"exact"`` (exact match) or ``"contains"`` (also
#: :func:`contains_match`).
MATCH_MODES: tuple[str, ...] = ("exact", "contains")


def contains_match(
    prediction: str, golds: str | Iterable[str], max_words: int = CONTAINS_MAX_WORDS
) -> float:
    """1.0 if a normalised gold answer appears as a run of whole words in the normalised
    ``prediction`` and the prediction has at most ``max_words`` words, else 0.0.

    The multi-document QA accuracy of Liu et al. ("Lost in the Middle", 2023: is a correct
    answer in the output?), which credits a sentence such as "The film was released in 2011."
    for the gold "2011"; the word cap keeps a pasted paragraph from counting, and a hedge
    (``Paris or Lyon``, :func:`~selfcest_env.tasks.extraction.is_hedge`) never counts unless a
    gold answer is one. A list (``Paris, Lyon``) is not caught: containment cannot tell it
    from a sentence with a comma, which is why exact match is the default mode.
    """
    words = normalize_answer(prediction).split()
    if not words or len(words) > max_words:
        return 0.0
    golds = _golds(golds)
    if is_hedge(prediction) and not any(is_hedge(g) for g in golds):
        return 0.0
    for gold in _golds(golds):
        span = normalize_answer(gold).split()
        width = len(span)
        if span and any(words[i : i + width] == span for i in range(len(words) - width + 1)):
            return 1.0
    return 0.0


def grade_qa(answer: str, gold: str, aliases: Iterable[str] = (), match: str = "exact") -> Grade:
    """Exact match after normalisation over ``gold`` and ``aliases`` (with ``match="contains"``
    a :func:`contains_match` counts too); exact match, containment and token F1 in the details.

    Only the reply's final answer is graded (:func:`graded_text`); one longer than
    :data:`~selfcest_env.tasks.extraction.MAX_ANSWER_CHARS` scores 0 with a reason.

    Raises:
        ValueError: ``match`` is not one of :data:`MATCH_MODES`.
    """
    if match not in MATCH_MODES:
        raise ValueError(f"unknown match mode {match!r}; choose one of {', '.join(MATCH_MODES)}")
    golds = [gold, *aliases]
    found = final_answer(answer)
    if found.too_long:
        return Grade(
            0.0,
            False,
            {"exact_match": 0.0, "contains": 0.0, "f1": 0.0, "reason": "answer too long"},
        )
    text = found.text
    em = exact_match(text, golds)
    contained = contains_match(text, golds)
    score = em if match == "exact" else max(em, contained)
    return Grade(
        score=score,
        correct=score == 1.0,
        details={
            "exact_match": em,
            "contains": contained,
            "f1": f1(text, golds),
            "normalized": normalize_answer(text),
        },
    )
