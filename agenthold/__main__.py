"""``python -m agenthold`` runs the ``agenthold`` command."""

import sys

from agenthold.front import main

sys.exit(main())
