"""The agents: policies over the environment, their model backends and their training.

Import package ``selfcest_env.agents``, folder ``agents/`` (``pyproject.toml`` maps it; grep for
the folder, import the package). It imports the environment and the tasks, never the harness.
Agents are found by name in :mod:`.registry`, backends in :mod:`.backends.registry`, credit
rules in :mod:`.training.credit`; other packages add their own through entry points
(:mod:`.plugins`).
"""
