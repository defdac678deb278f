"""``python -m agenthold`` runs the ``agenthold`` command."""

import sys

from agenthold.cli import main

sys.exit(main())
