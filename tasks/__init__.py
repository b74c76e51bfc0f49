"""Task sources: math and multi-hop QA behind one protocol (:mod:`.base`).

The folder ``tasks/`` is imported as ``selfcest_env.tasks`` (a top-level ``tasks`` package would
collide with other projects), so search for ``selfcest_env.tasks`` rather than ``tasks``. This is
the first layer: it imports no other part of SelfCest, except that a source given no token
counter falls back to the offline counter of :mod:`selfcest_env.tokens`.

* :mod:`.registry`: the one table of source names (and the ``selfcest.tasks`` entry points);
* :mod:`.loading`: the one reader of local task files and the base of the dataset loaders;
* :mod:`.extraction`, :mod:`.answers`: how a reply's final answer is read and compared;
* :mod:`.math`, :mod:`.qa`: the sources and their graders.
"""
