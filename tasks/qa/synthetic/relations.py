"""Relations, kinship terms and comparison templates: what questions are made of.

The generator (:mod:`.questions`) builds questions from these templates, and a reader that
parses rendered paragraphs can invert them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The entity kinds of a world.
KINDS: tuple[str, ...] = ("film", "company", "person", "city", "country")


@dataclass(frozen=True)
class Relation:
    """A relation from an entity of kind ``subject`` to an entity of kind ``target`` (or to a
    number, ``target == "value"``), with its noun phrase and its question."""

    subject: str
    target: str
    noun_phrase: str | None  # "the director of {x}" (entity relations)
    question: str  # "Who directed {x}?"


RELATIONS: dict[str, Relation] = {
    "director": Relation("film", "person", "the director of {x}", "Who directed {x}?"),
    "producer": Relation(
        "film", "company", "the company that produced {x}", "Which company produced {x}?"
    ),
    "founder": Relation("company", "person", "the founder of {x}", "Who founded {x}?"),
    "hq": Relation(
        "company", "city", "the city where {x} is headquartered", "Where is {x} headquartered?"
    ),
    "birthplace": Relation("person", "city", "the birthplace of {x}", "Where was {x} born?"),
    "mother": Relation("person", "person", "the mother of {x}", "Who is the mother of {x}?"),
    "father": Relation("person", "person", "the father of {x}", "Who is the father of {x}?"),
    "country": Relation(
        "city", "country", "the country where {x} lies", "In which country is {x} located?"
    ),
    "capital": Relation("country", "city", "the capital of {x}", "What is the capital of {x}?"),
    "birth_year": Relation("person", "value", None, "In what year was {x} born?"),
    "year": Relation("film", "value", None, "In what year was {x} released?"),
    "founded": Relation("company", "value", None, "In what year was {x} founded?"),
    "population": Relation("city", "value", None, "What is the population of {x}?"),
}
#: Kind -> the relations from it to another entity.
ENTITY_RELATIONS = {
    k: [r for r, v in RELATIONS.items() if v.subject == k and v.target != "value"] for k in KINDS
}
#: Kind -> every relation from it (to entities and to values).
ALL_RELATIONS = {k: [r for r, v in RELATIONS.items() if v.subject == k] for k in KINDS}
#: Consecutive relations that would lead back to where they started.
FORBIDDEN_PAIRS = {("country", "capital"), ("capital", "country")}
#: Two parent steps (from the person outwards) -> their kinship term.
KIN = {
    ("mother", "father"): "maternal grandfather",
    ("mother", "mother"): "maternal grandmother",
    ("father", "father"): "paternal grandfather",
    ("father", "mother"): "paternal grandmother",
}
KIN_STEPS = {v: k for k, v in KIN.items()}


@dataclass(frozen=True)
class Comparison:
    """A comparison question: entities of ``kind`` compared by ``value``, reached through the
    relation ``bridge`` when it is set (a bridge comparison)."""

    kind: str
    bridge: str | None
    value: str
    template: str  # with {which} (one of the two words) and {opts}
    words: tuple[str, str]  # (word for "smallest value wins", word for "largest value wins")


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("film", None, "year", "Which film came out {which}, {opts}?", ("first", "last")),
    Comparison("person", None, "birth_year", "Who was born {which}, {opts}?", ("first", "last")),
    Comparison(
        "city",
        None,
        "population",
        "Which city has the {which} population, {opts}?",
        ("smallest", "largest"),
    ),
    Comparison(
        "company", None, "founded", "Which company was founded {which}, {opts}?", ("first", "last")
    ),
)
BRIDGES: tuple[Comparison, ...] = (
    Comparison(
        "film",
        "director",
        "birth_year",
        "Which film has the director who was born {which}, {opts}?",
        ("earlier", "later"),
    ),
    Comparison(
        "film",
        "producer",
        "founded",
        "Which film was produced by the company founded {which}, {opts}?",
        ("earlier", "later"),
    ),
    Comparison(
        "company",
        "founder",
        "birth_year",
        "Which company has the founder who was born {which}, {opts}?",
        ("earlier", "later"),
    ),
    Comparison(
        "person",
        "birthplace",
        "population",
        "Who was born in the city with the {which} population, {opts}?",
        ("smaller", "larger"),
    ),
    Comparison(
        "person",
        "mother",
        "birth_year",
        "Whose mother was born {which}, {opts}?",
        ("earlier", "later"),
    ),
)


def options(names: Sequence[str]) -> str:
    """``"A, B or C"``: the options of a comparison question."""
    return f"{', '.join(names[:-1])} or {names[-1]}"
