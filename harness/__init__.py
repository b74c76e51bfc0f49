"""The harness: runs, run folders, suites, leaderboards, plots and the ``selfcest`` command.

Import package ``selfcest_env.harness``, folder ``harness/`` (``pyproject.toml`` maps it, as it
maps ``selfcest_env.tasks`` to ``tasks/`` and ``selfcest_env.agents`` to ``agents/``; grep for
the folder, import the package). It is the last layer: it imports the environment, the tasks and
the agents, and nothing imports it, so ``gym.make`` never loads it.
"""
