"""The task-source registry: one table from names to classes, for every domain.

The env factory, the CLI (``--source`` and its help), the suites and the benchmarks all build
sources here, by name: :func:`make_source`, :func:`source_names`, :func:`source_domain` and
:func:`source_class`. Names are matched ignoring case, ``-`` and ``_`` (``"MATH-500"`` is
``"math500"``); an unknown name is an error that lists the valid ones. A source's domain
(``"math"`` or ``"qa"``, which env takes it) is its class's :attr:`~.base.TaskSource.domain`.

**Adding a source** takes one file and one line:

1. write a module with a :class:`~.base.TaskSource` subclass that sets ``name``, ``domain``
   and ``answer_type`` and implements ``size``, ``get`` and ``grade`` (a generator draws
   instance ``i`` of a split from a stable hash of ``(seed, split, i)``; a dataset loader can
   build on :class:`~.loading.DatasetSource`);
2. add ``"name": "selfcest_env.tasks.<domain>.<module>:<Class>"`` to :data:`SOURCES`.

A source whose instances depend on token counts (a target context size) also sets
``takes_token_counter = True`` and takes ``token_counter=`` in its constructor; the env factory
then passes the env's counter, the model's tokenizer when the env has one.

**Another package** adds sources without touching this one, through the entry-point group
``selfcest.tasks``: each entry's name is the source name and its value ``"module:Class"``, a
:class:`~.base.TaskSource` subclass. In that package's ``pyproject.toml``::

    [project.entry-points."selfcest.tasks"]
    my_source = "my_package.my_module:MySource"

Built-in names win over an entry point of the same name (it is skipped, with a warning).
Classes are imported when first needed; an entry point that cannot be imported, or that is not
a ``TaskSource`` subclass, is a :class:`~selfcest_env.plugins.RegistryError` naming its
distribution. The plug-in machinery is :mod:`selfcest_env.plugins`, shared by every registry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from selfcest_env.plugins import Registry, RegistryError

from .base import TaskSource

logger = logging.getLogger(__name__)

__all__ = [
    "ENTRY_POINT_GROUP",
    "SOURCES",
    "make_source",
    "source_class",
    "source_domain",
    "source_names",
]

#: The entry-point group through which other packages add task sources.
ENTRY_POINT_GROUP = "selfcest.tasks"

#: Built-in sources: name -> ``"module:Class"`` (math first, then QA; the order of listings).
SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "arithmetic": "selfcest_env.tasks.math.arithmetic:ArithmeticTask",
        "countdown": "selfcest_env.tasks.math.countdown:CountdownTask",
        "gsm8k": "selfcest_env.tasks.math.datasets:GSM8KTask",
        "math": "selfcest_env.tasks.math.datasets:MATHTask",
        "math_hard": "selfcest_env.tasks.math.datasets:MATHHardTask",
        "math500": "selfcest_env.tasks.math.datasets:MATH500Task",
        "aime": "selfcest_env.tasks.math.datasets:AIMETask",
        "champ": "selfcest_env.tasks.math.champ:ChampTask",
        "synthetic": "selfcest_env.tasks.qa.synthetic:SyntheticQATask",
        "2wikimultihopqa": "selfcest_env.tasks.qa.datasets:TwoWikiMultihopQATask",
        "musique": "selfcest_env.tasks.qa.datasets:MuSiQueTask",
        "hotpotqa": "selfcest_env.tasks.qa.datasets:HotpotQATask",
    }
)


def _canonical(name: str) -> str:
    """A source name as it is matched: no case, no ``-`` or ``_`` (``MATH-500`` is ``math500``)."""
    return str(name).strip().lower().replace("-", "").replace("_", "")


_REGISTRY = Registry(
    kind="task source",
    group=ENTRY_POINT_GROUP,
    table=SOURCES,
    expected="a TaskSource subclass",
    accepts=lambda target: isinstance(target, type) and issubclass(target, TaskSource),
    key=_canonical,
)


def source_names(domain: str | None = None) -> tuple[str, ...]:
    """The registered source names (built-in, then plug-ins); with ``domain``, only those of
    that domain (which imports each class to read it; a plug-in that cannot be imported is
    left out with a warning, and reported when used)."""
    if domain is None:
        return _REGISTRY.names()
    names = []
    for name in _REGISTRY.names():
        try:
            if _REGISTRY.load(name)[1].domain == domain:
                names.append(name)
        except RegistryError as exc:
            logger.warning("%s", exc)
    return tuple(names)


def source_class(name: str, domain: str | None = None) -> type[TaskSource]:
    """The class registered as ``name``; with ``domain``, only a source of that domain.

    Raises:
        RegistryError: ``name`` is unknown or of another domain (the message lists the valid
            names), or a plug-in cannot be imported or is not a ``TaskSource`` subclass.
    """
    names = source_names(domain)
    if domain is not None and _canonical(name) not in {_canonical(n) for n in _REGISTRY.names()}:
        raise RegistryError(f"unknown task source {name!r}; valid names: {', '.join(names)}")
    cls = _REGISTRY.load(name)[1]
    if domain in (None, cls.domain):
        return cls
    raise RegistryError(
        f"{name!r} is a {cls.domain} task source, not a {domain} one; valid names: "
        f"{', '.join(names)}"
    )


def source_domain(name: str) -> str:
    """The domain (``"math"`` or ``"qa"``) of the source registered as ``name``."""
    return source_class(name).domain


def make_source(name: str, /, **kwargs: Any) -> TaskSource:
    """Build the source registered as ``name`` with ``kwargs`` (its class's arguments)."""
    return source_class(name)(**kwargs)
