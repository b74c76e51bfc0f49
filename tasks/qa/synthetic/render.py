"""Paragraphs: each entity of a world rendered as natural sentences under its name.

Sentences come in alternative wordings drawn from the world's generator, so a reader has to
parse language, not one fixed template.
"""

from __future__ import annotations

import random

from .vocabulary import CITY_ADJ, word
from .world import World


def _either(rng: random.Random, first: list[str], second: list[str]) -> list[str]:
    """``first`` or ``second``, each with probability 1/2 (one draw of ``rng``).

    Both renderings are formatted before the draw, so they must not draw from ``rng`` themselves.
    """
    return first if rng.random() < 0.5 else second


def render(world: World, name: str) -> str:
    """The paragraph of entity ``name`` (its title is the name); marks it rendered."""
    e = world.full(name)
    world.rendered.add(name)
    rng, a, n = world.rng, e.attrs, e.name
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
        cities = world.by_kind["city"]
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
        s.append(f"{'It' if rng.random() < 0.5 else 'The film'} was produced by {a['producer']}.")
        cities = world.by_kind["city"]
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
            adj = rng.choice(CITY_ADJ)
            art = "an" if adj[0] in "aeiou" else "a"
            s.append(f"{n} is {art} {adj} town located in {a['country']}.")
        s += _either(
            rng,
            [f"It has a population of {a['population']:,}."],
            [f"About {a['population']:,} people live there."],
        )
        if rng.random() < 0.5:
            s.append(f"It lies on the river {word(rng, 2)}.")
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
            s.append(f"Its official language is {word(rng, 2)}ish.")
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
