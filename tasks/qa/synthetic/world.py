"""The world of one instance: entities that are drawn as stubs and filled in when needed."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..metrics import normalize_answer
from .relations import KINDS
from .vocabulary import GENRES, INDUSTRIES, OCCUPATIONS, REGIONS, draw_name, name_split


@dataclass
class Entity:
    """One film, company, person, city or country; ``full`` once every attribute is set."""

    name: str
    kind: str
    attrs: dict[str, Any] = field(default_factory=dict)
    full: bool = False


class World:
    """Entities of one instance, every name of split ``split``; every draw comes from ``rng``.

    Stubs are filled in (materialised) when first needed: a person gets a birth year, an
    occupation, a birthplace and two new parents; a film a director and a producing studio; and
    so on. ``pending`` holds the names that have no paragraph yet, ``rendered`` those that do.
    """

    def __init__(self, rng: random.Random, split: str) -> None:
        self.rng = rng
        self.split = split
        self.entities: dict[str, Entity] = {}
        self.by_kind: dict[str, list[str]] = {k: [] for k in KINDS}
        self.taken: set[str] = set()
        self.pending: list[str] = []
        self.rendered: set[str] = set()

    def new(self, kind: str, **attrs: Any) -> Entity:
        """A new stub of ``kind`` with a fresh name that belongs to this world's split."""
        if kind == "person":
            attrs.setdefault("gender", self.rng.choice("mf"))
        for _ in range(10_000):
            name = draw_name(self.rng, kind, attrs)
            norm = normalize_answer(name)
            if norm not in self.taken and name_split(name) == self.split:
                break
        else:  # pragma: no cover - the name space is far larger than any world
            raise RuntimeError(f"could not draw a fresh {kind} name")
        self.taken.add(norm)
        entity = Entity(name, kind, dict(attrs))
        self.entities[name] = entity
        self.by_kind[kind].append(name)
        self.pending.append(name)
        return entity

    def _pick_existing(
        self, kind: str, ok: Callable[[Entity], Any] | None = None, p: float = 0.35
    ) -> Entity | None:
        """With probability ``p`` an existing entity of ``kind`` (that passes ``ok``)."""
        names = self.by_kind[kind]
        if not names or self.rng.random() >= p:
            return None
        for _ in range(4):
            entity = self.entities[self.rng.choice(names)]
            if ok is None or ok(entity):
                return entity
        return None

    def full(self, name: str) -> Entity:
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
            a.setdefault("occupation", rng.choice(OCCUPATIONS))
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
            a.setdefault("genre", rng.choice(GENRES))
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
                "industry", "film production" if a.get("studio") else rng.choice(INDUSTRIES)
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
            a.setdefault("region", rng.choice(REGIONS))
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
