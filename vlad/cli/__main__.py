"""``python -m vlad.cli ...`` runs ``vladctl``."""

import sys

from vlad.cli import vladctl_main

sys.exit(vladctl_main())
