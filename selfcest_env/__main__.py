"""``python -m selfcest_env``: the ``selfcest`` command (see :mod:`selfcest_env.harness.cli`).

The one module of the env package that reaches the harness, as the command's entry point.
"""

import sys

from selfcest_env.harness.cli import main

sys.exit(main())
