"""``python -m selfcest_env``: the ``selfcest`` command (see :mod:`selfcest_env.cli`)."""

import sys

from selfcest_env.cli import main

sys.exit(main())
