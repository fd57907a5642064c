"""``python -m fimls`` runs the command line."""

import sys

from fimls.cli import main

sys.exit(main())
