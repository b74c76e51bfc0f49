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
the whole context (titles plus texts, counted with the source's token counter: the env's when
the environment factory built the source, else the offline counter) is within
``context_tolerance`` (5%) of ``context_tokens``.

Presets (``preset=``, :meth:`SyntheticQAConfig.preset`): ``default`` (the field defaults: 2-4
hops, every question type, 8 distractors, exact match) and ``easy`` (one-hop compositional
questions, a single fact in a single paragraph, no distractors, and ``match="contains"``: the
135M default model answers in whole sentences, "X was released in 2011.", which exact match
scores 0 even when right).

Determinism and splits: instance ``i`` of a split is built from a seed that is a stable hash of
``(seed, split, i)``. Every entity name is assigned to one split by a stable hash of its
normalised form, and a split's worlds only use names of that split, so no entity (and hence no
question or paragraph) is shared between train, dev and test.

Modules, in the order an instance is made: :mod:`.config` (settings and presets),
:mod:`.vocabulary` (invented words and names), :mod:`.world` (entities), :mod:`.relations` (the
relation and comparison templates), :mod:`.questions` (one builder per question type),
:mod:`.render` (paragraphs) and :mod:`.source` (the task source).
"""

from .config import QUESTION_TYPES, TYPE_HOPS, SyntheticQAConfig
from .source import SyntheticQATask

__all__ = ["QUESTION_TYPES", "TYPE_HOPS", "SyntheticQAConfig", "SyntheticQATask"]
