"""`python -m orchestrator` = the `spectune` command."""

import sys

from orchestrator.cli import main

sys.exit(main())
