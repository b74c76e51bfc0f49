"""A scripted reader for the synthetic QA generator: answers from paragraph texts alone.

:func:`solve` parses the rendered sentences back into facts and follows the question's
relations through them; the tests use it to prove that every generated question is answerable
from its supporting paragraphs, and only from all of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from selfcest_env.tasks.qa.synthetic.relations import BRIDGES, COMPARISONS, KIN_STEPS, RELATIONS

_NAME = r"([^.,()]+?)"
#: (pattern, the relations its groups state, in order), for every wording of every fact.
_FACT_PATTERNS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(p), rels)
    for p, rels in (
        (r"\(born (\d{4})\) is an? ", ("birth_year",)),
        (r" who was born in the year (\d{4})\.", ("birth_year",)),
        (r"(?:^|\. )(?:He|She) was born in " + _NAME + r"\.", ("birthplace",)),
        (r"(?:^|\. )(?:His|Her) birthplace is " + _NAME + r"\.", ("birthplace",)),
        (r"(?:^|\. )(?:His|Her) mother is " + _NAME + r"\.", ("mother",)),
        (r"(?:^|\. )(?:His|Her) father is " + _NAME + r"\.", ("father",)),
        (
            r"is the (?:son|daughter) of " + _NAME + " and his wife " + _NAME + r"\.",
            ("father", "mother"),
        ),
        (
            r" is an? (\d{4}) [a-z ]+ film directed by " + _NAME + r"\.",
            ("year", "director"),
        ),
        (r" film released in (\d{4})\.", ("year",)),
        (r"(?:^|\. )It was directed by " + _NAME + r"\.", ("director",)),
        (r"(?:^|\. )(?:It|The film) was produced by " + _NAME + r"\.", ("producer",)),
        (
            r" is an? (?:[a-z]+ )?(?:city|town)(?: located)? in " + _NAME + r"\.",
            ("country",),
        ),
        (r"population of ([\d,]+)\.", ("population",)),
        (r"(?:^|\. )About ([\d,]+) people live there\.", ("population",)),
        (r"(?:^|\. )Its capital is " + _NAME + r"\.", ("capital",)),
        (r", with " + _NAME + r" as its capital\.", ("capital",)),
        (r" company founded in (\d{4}) by " + _NAME + r"\.", ("founded", "founder")),
        (r" was established by " + _NAME + r" in (\d{4})\.", ("founder", "founded")),
        (
            r"(?:^|\. )(?:It is headquartered|Its headquarters are) in " + _NAME + r"\.",
            ("hq",),
        ),
    )
)


def parse_paragraph(text: str) -> dict[str, str]:
    """The facts stated in one rendered paragraph, as ``{relation: value text}``."""
    facts: dict[str, str] = {}
    for pattern, rels in _FACT_PATTERNS:
        m = pattern.search(text)
        if m:
            for rel, value in zip(rels, m.groups()):
                facts.setdefault(rel, value.strip())
    return facts


def _template_regex(template: str, **groups: str) -> re.Pattern[str]:
    out = re.escape(template)
    for name, pattern in groups.items():
        out = out.replace(re.escape("{" + name + "}"), pattern)
    return re.compile(out)


_NP_REGEX = [
    (rel, _template_regex(r.noun_phrase, x="(?P<x>.+)"))
    for rel, r in RELATIONS.items()
    if r.noun_phrase
]
_KIN_REGEX = re.compile(r"the (maternal|paternal) (grandfather|grandmother) of (?P<x>.+)")
_Q_REGEX = [(rel, _template_regex(r.question, x="(?P<x>.+)")) for rel, r in RELATIONS.items()]
_CMP_REGEX = [
    (
        spec,
        _template_regex(spec.template, which=f"(?P<which>{'|'.join(words)})", opts="(?P<opts>.+)"),
    )
    for spec in COMPARISONS + BRIDGES
    for words in [spec.words + ("smaller", "larger")]
]


def _resolve(np: str, facts: Mapping[str, Mapping[str, str]]) -> str | None:
    """The entity a noun phrase (a name, a kinship term or a relation of one) refers to."""
    if np in facts:
        return np
    m = _KIN_REGEX.fullmatch(np)
    if m:
        inner = _resolve(m["x"], facts)
        steps = KIN_STEPS[f"{m[1]} {m[2]}"]
        for rel in steps:
            if inner is None:
                return None
            inner = facts.get(inner, {}).get(rel)
        return inner
    return _relation_of(_NP_REGEX, np, facts)


def _relation_of(
    patterns: Sequence[tuple[str, re.Pattern[str]]],
    text: str,
    facts: Mapping[str, Mapping[str, str]],
) -> str | None:
    """The value of ``rel`` for the first ``(rel, pattern)`` that fully matches ``text``.

    The pattern's ``x`` group is resolved to an entity (:func:`_resolve`) that must state
    ``rel``; patterns whose entity does not are skipped. ``None`` when no pattern gives a value.
    """
    for rel, pattern in patterns:
        m = pattern.fullmatch(text)
        if m:
            inner = _resolve(m["x"], facts)
            if inner is not None and rel in facts.get(inner, {}):
                return facts[inner][rel]
    return None


def solve(question: str, paragraphs: Mapping[str, str]) -> str | None:
    """Answer ``question`` from ``{title: paragraph text}`` by parsing the rendered sentences.

    Returns ``None`` when the paragraphs do not state what the question needs.
    """
    facts = {title: parse_paragraph(text) for title, text in paragraphs.items()}
    for spec, pattern in _CMP_REGEX:
        m = pattern.fullmatch(question)
        if not m:
            continue
        head, _, last = m["opts"].rpartition(" or ")
        names = [*head.split(", "), last]
        values = []
        for name in names:
            node: str | None = name
            if spec.bridge is not None:
                node = facts.get(name, {}).get(spec.bridge)
            raw = facts.get(node or "", {}).get(spec.value)
            if raw is None:
                return None
            values.append(int(raw.replace(",", "")))
        pick = max if m["which"] in (spec.words[1], "larger") else min
        return names[pick(range(len(names)), key=values.__getitem__)]
    answer = _relation_of(_Q_REGEX, question, facts)
    if answer is not None:
        return answer
    m = re.fullmatch(r"Who is (?P<x>.+)\?", question)
    if m:
        return _resolve(m["x"], facts)
    return None
