"""A synthetic multi-hop QA generator over fictional worlds, with a target context size.

Each instance builds its own small world of invented people, cities, countries, companies and
films, linked by relations (``director``, ``producer``, ``founder``, ``hq``, ``birthplace``,
``mother``, ``father``, ``country``, ``capital``) and values (``birth_year``, ``year``,
``founded``, ``population``). Every entity that enters the context is rendered as one natural
paragraph whose title is the entity's name. Questions follow the 2WikiMultihopQA types:

* ``compositional`` (1-4 hops): a chain of relations, "Where was the director of X born?" (one
  hop: a single fact, "Where was X born?");
* ``inference`` (2-4 hops): kinship chains, "Who is the maternal grandfather of X?";
* ``comparison`` (2-4 hops): compare one value of 2-4 entities, "Which film came out first, X
  or Y?";
* ``bridge_comparison`` (4 hops): compare a value one relation away from each of two entities,
  "Which film has the director who was born earlier, X or Y?".

``hops`` is the number of supporting paragraphs (``metadata["supporting_keys"]``): each hop is
one paragraph that has to be read. Distractor paragraphs are other entities of the same world
(often the neighbours of the supporting ones), added either ``num_distractors`` at a time or until
the whole context (titles plus texts, counted with a token counter, by default
:class:`~selfcest_env.tokens.OfflineTokenCounter`) is within ``context_tolerance`` (5%) of
``context_tokens``.

Presets (``preset=``, :meth:`SyntheticQAConfig.preset`): ``default`` (the field defaults: 2-4
hops, every question type, 8 distractors, exact match) and ``easy`` (one-hop compositional
questions, a single fact in a single paragraph, no distractors, and ``match="contains"``: the
135M default model answers in whole sentences, "X was released in 2011.", which exact match
scores 0 even when right).

Determinism and splits: instance ``i`` of a split is built from a seed that is a stable hash of
``(seed, split, i)``. Every entity name is assigned to one split by a stable hash of its
normalised form, and a split's worlds only use names of that split, so no entity (and hence no
question or paragraph) is shared between train, dev and test.

:func:`solve` is a scripted reader that answers a question from paragraph texts alone, by
parsing the rendered sentences; it proves that every generated question is answerable from its
supporting paragraphs.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..base import ContextItem, Grade, TaskInstance, TaskSource, check_split
from ..hashing import stable_hash64, stable_unit
from .metrics import MATCH_MODES, grade_qa, normalize_answer

logger = logging.getLogger(__name__)

__all__ = [
    "QUESTION_TYPES",
    "TYPE_HOPS",
    "SyntheticQAConfig",
    "SyntheticQATask",
    "solve",
]

QUESTION_TYPES: tuple[str, ...] = ("compositional", "comparison", "inference", "bridge_comparison")
#: Hop counts (supporting paragraphs) each question type can be generated with.
TYPE_HOPS: Mapping[str, tuple[int, ...]] = {
    "compositional": (1, 2, 3, 4),
    "comparison": (2, 3, 4),
    "inference": (2, 3, 4),
    "bridge_comparison": (4,),
}
_SPLIT_WEIGHTS = (("train", 0.6), ("dev", 0.2), ("test", 0.2))


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticQAConfig:
    """Settings of :class:`SyntheticQATask`.

    Attributes:
        hops: Allowed hop counts (supporting paragraphs), each in 1..4 (1: compositional only).
        question_types: Allowed types among :data:`QUESTION_TYPES`; each instance draws one
            (type, hops) pair uniformly among those the type supports (:data:`TYPE_HOPS`).
        num_distractors: Distractor paragraphs per instance when ``context_tokens`` is ``None``.
        context_tokens: Target total context size in tokens (titles plus texts); when given,
            distractors are added until the total is within ``context_tolerance`` of it.
        context_tolerance: Relative tolerance of ``context_tokens`` (0.05 = ±5%).
        seed: Base seed; instance ``i`` of a split uses a stable hash of (seed, split, i).
        surname_alias: Accept a person's surname alone as an alias of their full name.
        match: ``"exact"`` (SQuAD exact match) or ``"contains"`` (also a short answer that
            contains a gold answer, :func:`~selfcest_env.tasks.qa.metrics.contains_match`).
        preset_name: Name of the preset the config came from (informational).
    """

    hops: tuple[int, ...] = (2, 3, 4)
    question_types: tuple[str, ...] = QUESTION_TYPES
    num_distractors: int = 8
    context_tokens: int | None = None
    context_tolerance: float = 0.05
    seed: int = 0
    surname_alias: bool = True
    match: str = "exact"
    preset_name: str = "default"

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """Names accepted by :meth:`preset`."""
        return tuple(_PRESETS)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SyntheticQAConfig:
        """The config of preset ``name`` (see the module docstring), ``overrides`` applied."""
        if name not in _PRESETS:
            raise ValueError(
                f"unknown synthetic QA preset {name!r}; choose one of {', '.join(_PRESETS)}"
            )
        return cls(**{**_PRESETS[name], "preset_name": name, **overrides})

    def __post_init__(self) -> None:
        hops = (self.hops,) if isinstance(self.hops, int) else tuple(self.hops)
        types = (
            (self.question_types,)
            if isinstance(self.question_types, str)
            else tuple(self.question_types)
        )
        object.__setattr__(self, "hops", hops)
        object.__setattr__(self, "question_types", types)
        bad_hops = [h for h in hops if h not in (1, 2, 3, 4)]
        if not hops or bad_hops:
            raise ValueError(f"hops must be a non-empty selection of 1, 2, 3, 4; got {hops}")
        bad_types = [t for t in types if t not in QUESTION_TYPES]
        if not types or bad_types:
            raise ValueError(
                f"unknown question types {bad_types or types}; choose from {QUESTION_TYPES}"
            )
        if not self.combos():
            raise ValueError(
                f"no question type among {types} supports hops {hops}; supported: "
                + ", ".join(f"{t}: {TYPE_HOPS[t]}" for t in types)
            )
        if self.num_distractors < 0:
            raise ValueError(f"num_distractors must be >= 0, got {self.num_distractors}")
        if self.context_tokens is not None and self.context_tokens < 200:
            raise ValueError(f"context_tokens must be >= 200, got {self.context_tokens}")
        if self.match not in MATCH_MODES:
            raise ValueError(f"match must be one of {', '.join(MATCH_MODES)}; got {self.match!r}")
        if not 0.0 < self.context_tolerance < 0.5:
            raise ValueError(f"context_tolerance must be in (0, 0.5), got {self.context_tolerance}")

    def combos(self) -> list[tuple[str, int]]:
        """The (question type, hops) pairs this configuration draws from."""
        return [(t, h) for t in self.question_types for h in TYPE_HOPS[t] if h in self.hops]


_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "easy": {
        "hops": (1,),
        "question_types": ("compositional",),
        "num_distractors": 0,
        "match": "contains",
    },
}


# ----------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------

_ONSETS = [
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "fr",
    "gr",
    "kr",
    "pr",
    "tr",
    "st",
    "th",
    "sh",
    "vr",
    "sk",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ae", "ei", "ou", "ia"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "nd", "rk", "st", "th", "x"]
_FEMALE_END = ("a", "ia", "elle", "ine", "ora", "ys", "ette")
_MALE_END = ("o", "an", "ek", "us", "in", "or", "im")
_SURNAME_END = ("", "", "", "", "", "son", "ard", "mann", "ez", "ov", "worth", "ley", "ski", "ens")
_CITY_END = ("", "mora", "holm", "ford", "vale", "grad", "wick", "haven", "stad", "ton", "mere")
_COUNTRY_END = ("ia", "land", "ara", "ova", "esh", "ria", "onia")
_STUDIO_END = ("Pictures", "Studios", "Films", "Media", "Productions")
_COMPANY_END = ("Industries", "Holdings", "Works", "Systems", "Motors", "Foods", "Textiles")
_ADJECTIVES = [
    "Silent",
    "Crimson",
    "Hollow",
    "Broken",
    "Golden",
    "Distant",
    "Frozen",
    "Hidden",
    "Last",
    "Burning",
    "Quiet",
    "Scarlet",
    "Iron",
    "Velvet",
    "Glass",
    "Wandering",
    "Pale",
    "Endless",
    "Bitter",
    "Shallow",
    "Midnight",
    "Autumn",
    "Painted",
    "Lonely",
    "Savage",
    "Crooked",
    "Northern",
    "Fading",
    "Wild",
    "Second",
]
_NOUNS = [
    "Harbor",
    "Orchard",
    "River",
    "Lantern",
    "Garden",
    "Empire",
    "Mirror",
    "Shadow",
    "Voyage",
    "Summer",
    "Winter",
    "Station",
    "Tower",
    "Crown",
    "Meadow",
    "Signal",
    "Canyon",
    "Frontier",
    "Promise",
    "Letter",
    "Island",
    "Forest",
    "Kingdom",
    "Bridge",
    "Horizon",
    "Engine",
    "Dancer",
    "Stranger",
    "Witness",
    "Season",
]
_GENRES = [
    "drama",
    "comedy",
    "thriller",
    "western",
    "musical",
    "documentary",
    "romance",
    "horror",
    "mystery",
    "war",
    "adventure",
    "crime",
    "animated",
] + ["science fiction"]
_OCCUPATIONS = [
    "painter",
    "novelist",
    "architect",
    "physician",
    "composer",
    "engineer",
    "poet",
    "diplomat",
    "sculptor",
    "chemist",
    "journalist",
    "violinist",
    "economist",
]
_INDUSTRIES = [
    "textile",
    "shipping",
    "mining",
    "publishing",
    "brewing",
    "railway",
    "chemical",
    "software",
]
_REGIONS = (
    "the Northern Reach",
    "the Amber Coast",
    "the Eastern Steppe",
    "the Silver Isles",
    "the Western Marches",
    "the Southern Plateau",
    "the Inner Sea basin",
)
_CITY_ADJ = ("small", "coastal", "ancient", "industrial", "mountain", "river", "busy", "quiet")


#: Every onset + vowel + coda (duplicates kept, so one draw has the weights of three).
_SYLLABLES = [o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS]


def _word(rng: random.Random, syllables: int) -> str:
    if syllables == 1:
        return rng.choice(_SYLLABLES).capitalize()
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _either(rng: random.Random, first: list[str], second: list[str]) -> list[str]:
    """``first`` or ``second``, each with probability 1/2 (one draw of ``rng``).

    Both renderings are formatted before the draw, so they must not draw from ``rng`` themselves.
    """
    return first if rng.random() < 0.5 else second


def _name_split(name: str) -> str:
    u = stable_unit("selfcest-qa-name", normalize_answer(name))
    acc = 0.0
    for split, w in _SPLIT_WEIGHTS:
        acc += w
        if u < acc:
            return split
    return _SPLIT_WEIGHTS[-1][0]


# ----------------------------------------------------------------------------------------------
# Relations and question templates (shared by the generator and the scripted solver)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rel:
    subject: str
    target: str  # an entity kind, or "value"
    noun_phrase: str | None  # "the director of {x}" (entity relations)
    question: str  # "Who directed {x}?"


_RELATIONS: dict[str, _Rel] = {
    "director": _Rel("film", "person", "the director of {x}", "Who directed {x}?"),
    "producer": _Rel(
        "film", "company", "the company that produced {x}", "Which company produced {x}?"
    ),
    "founder": _Rel("company", "person", "the founder of {x}", "Who founded {x}?"),
    "hq": _Rel(
        "company", "city", "the city where {x} is headquartered", "Where is {x} headquartered?"
    ),
    "birthplace": _Rel("person", "city", "the birthplace of {x}", "Where was {x} born?"),
    "mother": _Rel("person", "person", "the mother of {x}", "Who is the mother of {x}?"),
    "father": _Rel("person", "person", "the father of {x}", "Who is the father of {x}?"),
    "country": _Rel(
        "city", "country", "the country where {x} lies", "In which country is {x} located?"
    ),
    "capital": _Rel("country", "city", "the capital of {x}", "What is the capital of {x}?"),
    "birth_year": _Rel("person", "value", None, "In what year was {x} born?"),
    "year": _Rel("film", "value", None, "In what year was {x} released?"),
    "founded": _Rel("company", "value", None, "In what year was {x} founded?"),
    "population": _Rel("city", "value", None, "What is the population of {x}?"),
}
_ENTITY_RELS = {
    k: [r for r, v in _RELATIONS.items() if v.subject == k and v.target != "value"]
    for k in ("film", "company", "person", "city", "country")
}
_ALL_RELS = {
    k: [r for r, v in _RELATIONS.items() if v.subject == k]
    for k in ("film", "company", "person", "city", "country")
}
_FORBIDDEN_PAIRS = {("country", "capital"), ("capital", "country")}
_KIN = {
    ("mother", "father"): "maternal grandfather",
    ("mother", "mother"): "maternal grandmother",
    ("father", "father"): "paternal grandfather",
    ("father", "mother"): "paternal grandmother",
}
_KIN_STEPS = {v: k for k, v in _KIN.items()}


@dataclass(frozen=True)
class _Comparison:
    kind: str
    bridge: str | None
    value: str
    template: str  # with {which} (one of the two words) and {opts}
    words: tuple[str, str]  # (word for "smallest value wins", word for "largest value wins")


_COMPARISONS: tuple[_Comparison, ...] = (
    _Comparison("film", None, "year", "Which film came out {which}, {opts}?", ("first", "last")),
    _Comparison("person", None, "birth_year", "Who was born {which}, {opts}?", ("first", "last")),
    _Comparison(
        "city",
        None,
        "population",
        "Which city has the {which} population, {opts}?",
        ("smallest", "largest"),
    ),
    _Comparison(
        "company", None, "founded", "Which company was founded {which}, {opts}?", ("first", "last")
    ),
)
_BRIDGES: tuple[_Comparison, ...] = (
    _Comparison(
        "film",
        "director",
        "birth_year",
        "Which film has the director who was born {which}, {opts}?",
        ("earlier", "later"),
    ),
    _Comparison(
        "film",
        "producer",
        "founded",
        "Which film was produced by the company founded {which}, {opts}?",
        ("earlier", "later"),
    ),
    _Comparison(
        "company",
        "founder",
        "birth_year",
        "Which company has the founder who was born {which}, {opts}?",
        ("earlier", "later"),
    ),
    _Comparison(
        "person",
        "birthplace",
        "population",
        "Who was born in the city with the {which} population, {opts}?",
        ("smaller", "larger"),
    ),
    _Comparison(
        "person",
        "mother",
        "birth_year",
        "Whose mother was born {which}, {opts}?",
        ("earlier", "later"),
    ),
)


def _options(names: Sequence[str]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"


# ----------------------------------------------------------------------------------------------
# The world
# ----------------------------------------------------------------------------------------------


@dataclass
class _Entity:
    name: str
    kind: str
    attrs: dict[str, Any] = field(default_factory=dict)
    full: bool = False


class _World:
    """Entities of one instance; stubs are filled in (materialised) when first needed."""

    def __init__(self, rng: random.Random, split: str) -> None:
        self.rng = rng
        self.split = split
        self.entities: dict[str, _Entity] = {}
        self.by_kind: dict[str, list[str]] = {
            k: [] for k in ("film", "company", "person", "city", "country")
        }
        self.taken: set[str] = set()
        self.pending: list[str] = []  # names that have no paragraph yet
        self.rendered: set[str] = set()

    # -- names -----------------------------------------------------------------------------

    def _draw_name(self, kind: str, attrs: Mapping[str, Any]) -> str:
        rng = self.rng
        if kind == "person":
            end = _FEMALE_END if attrs["gender"] == "f" else _MALE_END
            given = _word(rng, 1) + rng.choice(end)
            return f"{given} {_word(rng, rng.choice((1, 2, 2)))}{rng.choice(_SURNAME_END)}"
        if kind == "city":
            return _word(rng, rng.randint(1, 2)) + rng.choice(_CITY_END)
        if kind == "country":
            return _word(rng, rng.randint(1, 2)) + rng.choice(_COUNTRY_END)
        if kind == "company":
            ends = _STUDIO_END if attrs.get("studio") else _COMPANY_END
            return f"{_word(rng, rng.randint(1, 2))} {rng.choice(ends)}"
        pattern = rng.random()
        if pattern < 0.45:
            return f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        if pattern < 0.75:
            return f"The {rng.choice(_NOUNS)} of {_word(rng, rng.randint(1, 2))}"
        return f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} of {_word(rng, 2)}"

    def new(self, kind: str, **attrs: Any) -> _Entity:
        """A new stub of ``kind`` with a fresh name that belongs to this world's split."""
        if kind == "person":
            attrs.setdefault("gender", self.rng.choice("mf"))
        for _ in range(10_000):
            name = self._draw_name(kind, attrs)
            norm = normalize_answer(name)
            if norm not in self.taken and _name_split(name) == self.split:
                break
        else:  # pragma: no cover - the name space is far larger than any world
            raise RuntimeError(f"could not draw a fresh {kind} name")
        self.taken.add(norm)
        entity = _Entity(name, kind, dict(attrs))
        self.entities[name] = entity
        self.by_kind[kind].append(name)
        self.pending.append(name)
        return entity

    def _pick_existing(self, kind: str, ok: Any = None, p: float = 0.35) -> _Entity | None:
        names = self.by_kind[kind]
        if not names or self.rng.random() >= p:
            return None
        for _ in range(4):
            entity = self.entities[self.rng.choice(names)]
            if ok is None or ok(entity):
                return entity
        return None

    # -- materialisation -------------------------------------------------------------------

    def full(self, name: str) -> _Entity:
        """The entity ``name`` with every attribute filled in."""
        e = self.entities[name]
        if e.full:
            return e
        rng, a = self.rng, e.attrs
        if e.kind == "person":
            a.setdefault("birth_year", rng.randint(1850, 2000))
            role = a.get("role")
            if role == "director":
                a.setdefault("occupation", "film director")
            elif role == "founder":
                a.setdefault("occupation", "entrepreneur")
            a.setdefault("occupation", rng.choice(_OCCUPATIONS))
            if "birthplace" not in a:
                city = self._pick_existing("city") or self.new("city")
                a["birthplace"] = city.name
            a["mother"] = self.new(
                "person", gender="f", birth_year=a["birth_year"] - rng.randint(18, 42)
            ).name
            a["father"] = self.new(
                "person", gender="m", birth_year=a["birth_year"] - rng.randint(20, 48)
            ).name
        elif e.kind == "film":
            a.setdefault("year", rng.randint(1930, 2023))
            a.setdefault("genre", rng.choice(_GENRES))
            a["director"] = self.new(
                "person", role="director", birth_year=a["year"] - rng.randint(25, 65)
            ).name
            year = a["year"]
            company = self._pick_existing(
                "company", lambda c: c.attrs.get("studio") and c.attrs["founded"] < year
            ) or self.new("company", studio=True, founded=year - rng.randint(1, 60))
            a["producer"] = company.name
        elif e.kind == "company":
            a.setdefault("founded", rng.randint(1880, 2015))
            a.setdefault(
                "industry", "film production" if a.get("studio") else rng.choice(_INDUSTRIES)
            )
            a["founder"] = self.new(
                "person", role="founder", birth_year=a["founded"] - rng.randint(25, 55)
            ).name
            city = self._pick_existing("city") or self.new("city")
            a["hq"] = city.name
        elif e.kind == "city":
            if "country" not in a:
                country = self._pick_existing("country", p=0.5) or self.new("country")
                a["country"] = country.name
            a.setdefault("population", rng.randint(2, 9_000) * 1_000 + rng.randint(0, 999))
        elif e.kind == "country":
            a.setdefault("region", rng.choice(_REGIONS))
            a["capital"] = self.new(
                "city",
                country=e.name,
                population=rng.randint(200, 9_000) * 1_000 + rng.randint(0, 999),
            ).name
        e.full = True
        return e

    def value(self, name: str, rel: str) -> Any:
        """Attribute ``rel`` of entity ``name`` (materialising it)."""
        return self.full(name).attrs[rel]

    # -- rendering -------------------------------------------------------------------------

    def render(self, name: str) -> str:
        """The paragraph of entity ``name`` (its title is the name)."""
        e = self.full(name)
        self.rendered.add(name)
        rng, a, n = self.rng, e.attrs, e.name
        s: list[str] = []
        if e.kind == "person":
            he, his = ("She", "Her") if a["gender"] == "f" else ("He", "His")
            child = "daughter" if a["gender"] == "f" else "son"
            occ = a["occupation"]
            art = "an" if occ[0] in "aeiou" else "a"
            s += _either(
                rng,
                [f"{n} (born {a['birth_year']}) is {art} {occ}."],
                [f"{n} is {art} {occ} who was born in the year {a['birth_year']}."],
            )
            s += _either(
                rng,
                [f"{he} was born in {a['birthplace']}."],
                [f"{his} birthplace is {a['birthplace']}."],
            )
            s += _either(
                rng,
                [f"{his} mother is {a['mother']}.", f"{his} father is {a['father']}."],
                [f"{he} is the {child} of {a['father']} and his wife {a['mother']}."],
            )
            cities = self.by_kind["city"]
            if rng.random() < 0.5 and cities:
                s.append(f"{he} spent most of {his.lower()} career in {rng.choice(cities)}.")
            if rng.random() < 0.4:
                s.append(f"{his} work has been the subject of several exhibitions and essays.")
        elif e.kind == "film":
            art = "an" if a["genre"][0] in "aeiou" else "a"
            s += _either(
                rng,
                [f"{n} is a {a['year']} {a['genre']} film directed by {a['director']}."],
                [
                    f"{n} is {art} {a['genre']} film released in {a['year']}.",
                    f"It was directed by {a['director']}.",
                ],
            )
            s.append(
                f"{'It' if rng.random() < 0.5 else 'The film'} was produced by {a['producer']}."
            )
            cities = self.by_kind["city"]
            if rng.random() < 0.5 and cities:
                s.append(f"Principal photography took place in {rng.choice(cities)}.")
            if rng.random() < 0.5:
                s.append(f"The film runs for {rng.randint(80, 190)} minutes.")
            if rng.random() < 0.4:
                s.append(f"It received {rng.choice(['mixed', 'positive', 'warm'])} reviews.")
        elif e.kind == "city":
            if rng.random() < 0.5:
                s.append(f"{n} is a city in {a['country']}.")
            else:
                adj = rng.choice(_CITY_ADJ)
                art = "an" if adj[0] in "aeiou" else "a"
                s.append(f"{n} is {art} {adj} town located in {a['country']}.")
            s += _either(
                rng,
                [f"It has a population of {a['population']:,}."],
                [f"About {a['population']:,} people live there."],
            )
            if rng.random() < 0.5:
                s.append(f"It lies on the river {_word(rng, 2)}.")
            if rng.random() < 0.4:
                s.append(
                    f"The town is known for its {rng.choice(['markets', 'bridges', 'festivals'])}."
                )
        elif e.kind == "country":
            s += _either(
                rng,
                [f"{n} is a country in {a['region']}.", f"Its capital is {a['capital']}."],
                [f"{n} is a nation in {a['region']}, with {a['capital']} as its capital."],
            )
            if rng.random() < 0.5:
                s.append(f"Its official language is {_word(rng, 2)}ish.")
        else:
            s += _either(
                rng,
                [f"{n} is a {a['industry']} company founded in {a['founded']} by {a['founder']}."],
                [f"{n} was established by {a['founder']} in {a['founded']}."],
            )
            s += _either(
                rng, [f"It is headquartered in {a['hq']}."], [f"Its headquarters are in {a['hq']}."]
            )
            if rng.random() < 0.5:
                s.append(f"The company employs about {rng.randint(20, 9000):,} people.")
        return " ".join(s)


# ----------------------------------------------------------------------------------------------
# Question generation
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Question:
    text: str
    answer: str
    aliases: tuple[str, ...]
    supporting: tuple[str, ...]
    detail: Mapping[str, Any]


class _Retry(Exception):
    """The drawn question was degenerate (a tie or a repeated entity); draw again."""


_START_WEIGHTS = (
    ("film", 0.4),
    ("company", 0.15),
    ("person", 0.25),
    ("city", 0.12),
    ("country", 0.08),
)


def _weighted(rng: random.Random, items: Sequence[tuple[str, float]]) -> str:
    u = rng.random() * sum(w for _, w in items)
    for name, w in items:
        u -= w
        if u < 0:
            return name
    return items[-1][0]


class _Builder:
    def __init__(self, world: _World, cfg: SyntheticQAConfig) -> None:
        self.w = world
        self.cfg = cfg
        self.rng = world.rng

    def _answer(self, value: Any, target: str) -> tuple[str, tuple[str, ...]]:
        if target == "value":
            if isinstance(value, int) and value >= 10_000:
                return str(value), (f"{value:,}",)
            return str(value), ()
        if target == "person" and self.cfg.surname_alias:
            return value, (value.split(" ", 1)[1],)
        return value, ()

    def compositional(self, hops: int) -> _Question:
        rng = self.rng
        kind = _weighted(rng, _START_WEIGHTS)
        rels: list[str] = []
        for step in range(hops):
            options = _ALL_RELS[kind] if step == hops - 1 else _ENTITY_RELS[kind]
            options = [r for r in options if not rels or (rels[-1], r) not in _FORBIDDEN_PAIRS]
            if not options:
                raise _Retry
            rel = rng.choice(options)
            rels.append(rel)
            kind = _RELATIONS[rel].target
        if all(r in ("mother", "father") for r in rels):
            raise _Retry
        start = self.w.new(_RELATIONS[rels[0]].subject).name
        chain = [start]
        for rel in rels[:-1]:
            chain.append(self.w.value(chain[-1], rel))
        if len(set(chain)) != len(chain):
            raise _Retry
        value = self.w.value(chain[-1], rels[-1])
        if value in chain:
            raise _Retry
        np = start
        for rel in rels[:-1]:
            np = _RELATIONS[rel].noun_phrase.format(x=np)  # type: ignore[union-attr]
        text = _RELATIONS[rels[-1]].question.format(x=np)
        answer, aliases = self._answer(value, _RELATIONS[rels[-1]].target)
        return _Question(text, answer, aliases, tuple(chain), {"relations": tuple(rels)})

    def inference(self, hops: int) -> _Question:
        rng = self.rng
        steps = [rng.choice(("mother", "father")) for _ in range(hops)]
        start = self.w.new("person").name
        chain = [start]
        for rel in steps[:-1]:
            chain.append(self.w.value(chain[-1], rel))
        value = self.w.value(chain[-1], steps[-1])
        # Group the steps from the question entity outwards: pairs become kinship terms.
        np = start
        i = 0
        if hops % 2 == 1:
            np = _RELATIONS[steps[0]].noun_phrase.format(x=np)  # type: ignore[union-attr]
            i = 1
        while i < hops:
            np = f"the {_KIN[(steps[i], steps[i + 1])]} of {np}"
            i += 2
        answer, aliases = self._answer(value, "person")
        return _Question(
            f"Who is {np}?", answer, aliases, tuple(chain), {"relations": tuple(steps)}
        )

    def _compare(self, spec: _Comparison, count: int) -> _Question:
        rng = self.rng
        names = [self.w.new(spec.kind).name for _ in range(count)]
        values = []
        support = list(names)
        for n in names:
            if spec.bridge is None:
                values.append(self.w.value(n, spec.value))
            else:
                b = self.w.value(n, spec.bridge)
                support.append(b)
                values.append(self.w.value(b, spec.value))
        if len(set(values)) != len(values) or len(set(support)) != len(support):
            raise _Retry
        largest = rng.random() < 0.5
        word = spec.words[1] if largest else spec.words[0]
        if count == 2 and spec.bridge is None and word in ("smallest", "largest"):
            word = {"smallest": "smaller", "largest": "larger"}[word]
        best = (
            max(range(count), key=values.__getitem__)
            if largest
            else min(range(count), key=values.__getitem__)
        )
        text = spec.template.format(which=word, opts=_options(names))
        answer, aliases = self._answer(names[best], spec.kind)
        detail = {"relations": (spec.bridge, spec.value) if spec.bridge else (spec.value,)}
        return _Question(text, answer, aliases, tuple(support), detail)

    def comparison(self, hops: int) -> _Question:
        return self._compare(self.rng.choice(_COMPARISONS), hops)

    def bridge_comparison(self, hops: int) -> _Question:
        if hops != 4:
            raise ValueError(f"bridge_comparison questions have 4 hops, not {hops}")
        return self._compare(self.rng.choice(_BRIDGES), 2)


# ----------------------------------------------------------------------------------------------
# The task source
# ----------------------------------------------------------------------------------------------


class SyntheticQATask(TaskSource):
    """Unbounded synthetic multi-hop QA (see the module docstring).

    Args:
        config: A :class:`SyntheticQAConfig`; keyword arguments override its fields.
        preset: A preset name (:meth:`SyntheticQAConfig.preset`), instead of ``config``.
        token_counter: Counts context tokens for ``context_tokens`` (default: the offline
            counter of :mod:`selfcest_env.tokens`).
    """

    name = "synthetic"
    domain = "qa"

    def __init__(
        self,
        config: SyntheticQAConfig | None = None,
        *,
        preset: str | None = None,
        token_counter: Any | None = None,
        **overrides: Any,
    ) -> None:
        if config is not None and preset is not None:
            raise ValueError("pass either config= or preset=, not both")
        base = config or SyntheticQAConfig.preset(preset or "default")
        unknown = sorted(set(overrides) - set(SyntheticQAConfig.__dataclass_fields__))
        if unknown:
            raise TypeError(
                f"unknown SyntheticQAConfig fields {unknown}; valid: "
                f"{sorted(SyntheticQAConfig.__dataclass_fields__)}"
            )
        self.config = replace(base, **overrides) if overrides else base
        if token_counter is None:
            from selfcest_env.tokens import OfflineTokenCounter

            token_counter = OfflineTokenCounter()
        self.token_counter = token_counter
        self._combos = self.config.combos()

    def size(self, split: str) -> int | None:
        """``None``: the generator is unbounded."""
        check_split(split)
        return None

    def _cost(self, title: str, text: str) -> int:
        return self.token_counter.count_text(title) + self.token_counter.count_text(text)

    def get(self, split: str, index: int) -> TaskInstance:
        """Instance ``index`` of ``split``, built from a stable hash of (seed, split, index)."""
        check_split(split)
        if index < 0:
            raise IndexError(f"index must be >= 0, got {index}")
        cfg = self.config
        seed = stable_hash64("selfcest-qa-synthetic", cfg.seed, split, index)
        rng = random.Random(seed)
        qtype, hops = self._combos[rng.randrange(len(self._combos))]
        for _attempt in range(100):
            world = _World(rng, split)
            try:
                question = getattr(_Builder(world, cfg), qtype)(hops)
                break
            except _Retry:
                continue
        else:  # pragma: no cover - ties are rare
            raise RuntimeError(f"could not draw a {qtype} question for {split}/{index}")
        items = [ContextItem(n, world.render(n)) for n in question.supporting]
        total = sum(self._cost(it.key, it.text) for it in items)
        if cfg.context_tokens is None:
            for _ in range(cfg.num_distractors):
                name = self._next_distractor(world)
                items.append(ContextItem(name, world.render(name)))
                total += self._cost(name, items[-1].text)
        else:
            total = self._fill(world, items, total, split, index)
        rng.shuffle(items)
        return TaskInstance(
            task_id=f"synthetic-{split}-{index}",
            prompt=question.text,
            answer=question.answer,
            aliases=question.aliases,
            context=tuple(items),
            metadata={
                "hops": hops,
                "type": qtype,
                "supporting_keys": question.supporting,
                "context_tokens": total,
                "target_context_tokens": cfg.context_tokens,
                "num_paragraphs": len(items),
                "relations": question.detail["relations"],
            },
        )

    def _fill(
        self, world: _World, items: list[ContextItem], total: int, split: str, index: int
    ) -> int:
        cfg = self.config
        target = cfg.context_tokens
        assert target is not None
        upper = target * (1 + cfg.context_tolerance)
        lower = target * (1 - cfg.context_tolerance)
        if total > upper:
            raise ValueError(
                f"context_tokens={target} is too small: the supporting paragraphs of "
                f"{split}/{index} alone take {total} tokens"
            )
        misses = 0
        while total < target and misses < 200:
            name = self._next_distractor(world)
            text = world.render(name)
            cost = self._cost(name, text)
            if total + cost <= upper:
                items.append(ContextItem(name, text))
                total += cost
                misses = 0
            else:
                misses += 1
        if total < lower:  # pragma: no cover - paragraphs are far shorter than the tolerance
            logger.warning("context of %s/%d has %d tokens, target %d", split, index, total, target)
        return total

    def _next_distractor(self, world: _World) -> str:
        rng = world.rng
        pending = world.pending
        while pending and rng.random() < 0.6:
            i = rng.randrange(len(pending))
            pending[i], pending[-1] = pending[-1], pending[i]
            name = pending.pop()
            if name not in world.rendered:
                return name
        while True:
            name = world.new(_weighted(rng, _START_WEIGHTS)).name
            if name not in world.rendered:
                return name

    def grade(self, instance: TaskInstance, answer: str) -> Grade:
        """Normalised exact match (or containment, with ``match="contains"``) over the answer
        and its aliases; F1 in the details."""
        return grade_qa(answer, instance.answer, instance.aliases, self.config.match)


# ----------------------------------------------------------------------------------------------
# Scripted solver: answers from paragraph texts only
# ----------------------------------------------------------------------------------------------

_NAME = r"([^.,()]+?)"
_FACT_PATTERNS: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (kind, re.compile(p), rels)
    for kind, p, rels in (
        ("person", r"\(born (\d{4})\) is an? ", ("birth_year",)),
        ("person", r" who was born in the year (\d{4})\.", ("birth_year",)),
        ("person", r"(?:^|\. )(?:He|She) was born in " + _NAME + r"\.", ("birthplace",)),
        ("person", r"(?:^|\. )(?:His|Her) birthplace is " + _NAME + r"\.", ("birthplace",)),
        ("person", r"(?:^|\. )(?:His|Her) mother is " + _NAME + r"\.", ("mother",)),
        ("person", r"(?:^|\. )(?:His|Her) father is " + _NAME + r"\.", ("father",)),
        (
            "person",
            r"is the (?:son|daughter) of " + _NAME + " and his wife " + _NAME + r"\.",
            ("father", "mother"),
        ),
        (
            "film",
            r" is an? (\d{4}) [a-z ]+ film directed by " + _NAME + r"\.",
            ("year", "director"),
        ),
        ("film", r" film released in (\d{4})\.", ("year",)),
        ("film", r"(?:^|\. )It was directed by " + _NAME + r"\.", ("director",)),
        ("film", r"(?:^|\. )(?:It|The film) was produced by " + _NAME + r"\.", ("producer",)),
        (
            "city",
            r" is an? (?:[a-z]+ )?(?:city|town)(?: located)? in " + _NAME + r"\.",
            ("country",),
        ),
        ("city", r"population of ([\d,]+)\.", ("population",)),
        ("city", r"(?:^|\. )About ([\d,]+) people live there\.", ("population",)),
        ("country", r"(?:^|\. )Its capital is " + _NAME + r"\.", ("capital",)),
        ("country", r", with " + _NAME + r" as its capital\.", ("capital",)),
        ("company", r" company founded in (\d{4}) by " + _NAME + r"\.", ("founded", "founder")),
        ("company", r" was established by " + _NAME + r" in (\d{4})\.", ("founder", "founded")),
        (
            "company",
            r"(?:^|\. )(?:It is headquartered|Its headquarters are) in " + _NAME + r"\.",
            ("hq",),
        ),
    )
)
_NUMERIC = {"birth_year", "year", "founded", "population"}


def parse_paragraph(text: str) -> dict[str, str]:
    """The facts stated in one rendered paragraph, as ``{relation: value text}``."""
    facts: dict[str, str] = {}
    for _kind, pattern, rels in _FACT_PATTERNS:
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
    for rel, r in _RELATIONS.items()
    if r.noun_phrase
]
_KIN_REGEX = re.compile(r"the (maternal|paternal) (grandfather|grandmother) of (?P<x>.+)")
_Q_REGEX = [(rel, _template_regex(r.question, x="(?P<x>.+)")) for rel, r in _RELATIONS.items()]
_CMP_REGEX = [
    (
        spec,
        _template_regex(spec.template, which=f"(?P<which>{'|'.join(words)})", opts="(?P<opts>.+)"),
    )
    for spec in _COMPARISONS + _BRIDGES
    for words in [spec.words + ("smaller", "larger")]
]


def _resolve(np: str, facts: Mapping[str, Mapping[str, str]]) -> str | None:
    if np in facts:
        return np
    m = _KIN_REGEX.fullmatch(np)
    if m:
        inner = _resolve(m["x"], facts)
        steps = _KIN_STEPS[f"{m[1]} {m[2]}"]
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
