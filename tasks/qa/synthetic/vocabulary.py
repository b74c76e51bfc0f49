"""The invented vocabulary of the synthetic worlds: syllables, names, genres, occupations.

Every name belongs to one split (:func:`name_split`, a stable hash of its normalised form), so
worlds of different splits never share an entity.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ...hashing import stable_unit
from ..metrics import normalize_answer

ONSETS = (
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
)
VOWELS = (
    "a",
    "e",
    "i",
    "o",
    "u",
    "a",
    "e",
    "i",
    "o",
    "ae",
    "ei",
    "ou",
    "ia",
)
CODAS = (
    "",
    "",
    "",
    "n",
    "r",
    "l",
    "s",
    "m",
    "nd",
    "rk",
    "st",
    "th",
    "x",
)
#: Every onset + vowel + coda (duplicates kept, so one draw has the weights of three).
SYLLABLES = [o + v + c for o in ONSETS for v in VOWELS for c in CODAS]

FEMALE_END = ("a", "ia", "elle", "ine", "ora", "ys", "ette")
MALE_END = ("o", "an", "ek", "us", "in", "or", "im")
SURNAME_END = ("", "", "", "", "", "son", "ard", "mann", "ez", "ov", "worth", "ley", "ski", "ens")
CITY_END = ("", "mora", "holm", "ford", "vale", "grad", "wick", "haven", "stad", "ton", "mere")
COUNTRY_END = ("ia", "land", "ara", "ova", "esh", "ria", "onia")
STUDIO_END = ("Pictures", "Studios", "Films", "Media", "Productions")
COMPANY_END = ("Industries", "Holdings", "Works", "Systems", "Motors", "Foods", "Textiles")
ADJECTIVES = (
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
)
NOUNS = (
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
)
GENRES = (
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
    "science fiction",
)
OCCUPATIONS = (
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
)
INDUSTRIES = (
    "textile",
    "shipping",
    "mining",
    "publishing",
    "brewing",
    "railway",
    "chemical",
    "software",
)
REGIONS = (
    "the Northern Reach",
    "the Amber Coast",
    "the Eastern Steppe",
    "the Silver Isles",
    "the Western Marches",
    "the Southern Plateau",
    "the Inner Sea basin",
)
CITY_ADJ = ("small", "coastal", "ancient", "industrial", "mountain", "river", "busy", "quiet")

_SPLIT_WEIGHTS = (("train", 0.6), ("dev", 0.2), ("test", 0.2))


def word(rng: random.Random, syllables: int) -> str:
    """An invented, capitalised word of ``syllables`` syllables."""
    if syllables == 1:
        return rng.choice(SYLLABLES).capitalize()
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def draw_name(rng: random.Random, kind: str, attrs: Mapping[str, Any]) -> str:
    """A fresh name for an entity of ``kind`` (a person's ``attrs`` give the gender, a
    company's whether it is a film studio)."""
    if kind == "person":
        end = FEMALE_END if attrs["gender"] == "f" else MALE_END
        given = word(rng, 1) + rng.choice(end)
        return f"{given} {word(rng, rng.choice((1, 2, 2)))}{rng.choice(SURNAME_END)}"
    if kind == "city":
        return word(rng, rng.randint(1, 2)) + rng.choice(CITY_END)
    if kind == "country":
        return word(rng, rng.randint(1, 2)) + rng.choice(COUNTRY_END)
    if kind == "company":
        ends = STUDIO_END if attrs.get("studio") else COMPANY_END
        return f"{word(rng, rng.randint(1, 2))} {rng.choice(ends)}"
    pattern = rng.random()
    if pattern < 0.45:
        return f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    if pattern < 0.75:
        return f"The {rng.choice(NOUNS)} of {word(rng, rng.randint(1, 2))}"
    return f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} of {word(rng, 2)}"


def name_split(name: str) -> str:
    """The split that ``name`` belongs to (60% train, 20% dev, 20% test by a stable hash)."""
    u = stable_unit("selfcest-qa-name", normalize_answer(name))
    acc = 0.0
    for split, w in _SPLIT_WEIGHTS:
        acc += w
        if u < acc:
            return split
    return _SPLIT_WEIGHTS[-1][0]
