"""``python -m p2ptrain.cli``: what the systemd units and local swarms run (no console script needed)."""

import sys

from p2ptrain.cli.main import main

sys.exit(main())
