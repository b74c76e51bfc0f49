"""Reading the synthetic QA generator's text back: facts from paragraphs, plans from questions.

* :func:`parse_paragraph` parses a rendered paragraph's sentences (every wording) into facts.
* :func:`plan_question` turns a question into a :class:`QuestionPlan`: the chains of relations
  to follow, one per entity the question starts from, and how their ends give the answer. A
  plan needs no paragraph, so a reader that sees only the context keys (the root of
  ``SelfCest-MultiHopQA-v0``) can still say which single facts to look up, hop by hop.
* :func:`follow` runs a plan against any lookup of single facts (parsed paragraphs, or the
  answers of clones that each read one paragraph), and :func:`solve` answers a question from
  paragraph texts alone.

The scripted QA delegator (:class:`~selfcest_env.agents.scripted_qa.ScriptedQADelegator`) and
the generator's tests (every question answerable from its supporting paragraphs, and only from
all of them) are built on these.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from .relations import BRIDGES, COMPARISONS, KIN_STEPS, RELATIONS

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


@dataclass(frozen=True)
class Chain:
    """Relations to follow from the entity ``start``, in order (``("director",
    "birthplace")``: the birthplace of the director of ``start``)."""

    start: str
    relations: tuple[str, ...]


@dataclass(frozen=True)
class QuestionPlan:
    """What answering a question takes.

    Attributes:
        chains: One chain for a compositional or kinship question (its end is the answer); one
            per option for a comparison (each ends at a number), all of the same length.
        pick: ``None`` for one chain; ``"min"`` or ``"max"``: the answer is the ``start`` of
            the chain whose number is the smallest or the largest.
    """

    chains: tuple[Chain, ...]
    pick: str | None = None

    @property
    def hops(self) -> int:
        """Facts looked up in a row (the rounds a hop-by-hop delegation takes)."""
        return len(self.chains[0].relations)


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
_WHO_REGEX = re.compile(r"Who is (?P<x>.+)\?")
_CMP_REGEX = [
    (
        spec,
        _template_regex(spec.template, which=f"(?P<which>{'|'.join(words)})", opts="(?P<opts>.+)"),
    )
    for spec in COMPARISONS + BRIDGES
    for words in [spec.words + ("smaller", "larger")]
]


def _chain_of(phrase: str, names: Collection[str] | None) -> Chain | None:
    """The chain a noun phrase (a name, a kinship term or a relation of one) stands for.

    A phrase in ``names`` is a name even when it reads like a relation; with ``names`` given,
    a chain must start from one of them.
    """
    if names is not None and phrase in names:
        return Chain(phrase, ())
    kin = _KIN_REGEX.fullmatch(phrase)
    if kin:
        inner = _chain_of(kin["x"], names)
        steps = KIN_STEPS[f"{kin[1]} {kin[2]}"]
        return None if inner is None else Chain(inner.start, inner.relations + steps)
    for rel, pattern in _NP_REGEX:
        m = pattern.fullmatch(phrase)
        if m:
            inner = _chain_of(m["x"], names)
            if inner is not None:
                return Chain(inner.start, inner.relations + (rel,))
    if names is None:
        return Chain(phrase, ())
    return None


def plan_question(question: str, names: Collection[str] | None = None) -> QuestionPlan | None:
    """The plan of a generated question, ``None`` when it is not one of the generator's forms.

    ``names`` (the context keys, when known) settles phrases that could be a name or a
    relation, and every chain must then start from one of them.
    """
    question = question.strip()
    for spec, pattern in _CMP_REGEX:
        m = pattern.fullmatch(question)
        if not m:
            continue
        head, _, last = m["opts"].rpartition(" or ")
        options = [*head.split(", "), last] if head else [last]
        if names is not None and not all(option in names for option in options):
            continue
        relations = (spec.bridge, spec.value) if spec.bridge else (spec.value,)
        pick = "max" if m["which"] in (spec.words[1], "larger") else "min"
        return QuestionPlan(tuple(Chain(option, relations) for option in options), pick)
    for rel, pattern in _Q_REGEX:
        m = pattern.fullmatch(question)
        if m:
            chain = _chain_of(m["x"], names)
            if chain is not None:
                return QuestionPlan((Chain(chain.start, chain.relations + (rel,)),))
    m = _WHO_REGEX.fullmatch(question)
    if m:
        chain = _chain_of(m["x"], names)
        if chain is not None and chain.relations:
            return QuestionPlan((chain,))
    return None


def number_of(text: str) -> int | None:
    """The integer a fact's value states (``"12,400"`` -> 12400), ``None`` when it is not one."""
    digits = text.strip().replace(",", "")
    return int(digits) if re.fullmatch(r"\d{1,12}", digits) else None


def follow(plan: QuestionPlan, lookup: Callable[[str, str], str | None]) -> str | None:
    """The answer ``plan`` gives when ``lookup(entity, relation)`` states each fact; ``None``
    when a fact is missing (or a compared value is not a number)."""
    ends = []
    for chain in plan.chains:
        node: str | None = chain.start
        for rel in chain.relations:
            node = lookup(node, rel)
            if node is None:
                return None
        ends.append(node)
    if plan.pick is None:
        return ends[0]
    values = [number_of(end) for end in ends]
    if None in values:
        return None
    best = (max if plan.pick == "max" else min)(range(len(values)), key=values.__getitem__)
    return plan.chains[best].start


def solve(question: str, paragraphs: Mapping[str, str]) -> str | None:
    """Answer ``question`` from ``{title: paragraph text}`` by parsing the rendered sentences.

    Returns ``None`` when the paragraphs do not state what the question needs.
    """
    facts = {title: parse_paragraph(text) for title, text in paragraphs.items()}
    plan = plan_question(question, facts)
    if plan is None:
        plan = plan_question(question)
    if plan is None:
        return None
    return follow(plan, lambda entity, rel: facts.get(entity, {}).get(rel))
