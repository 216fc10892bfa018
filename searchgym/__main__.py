"""``python -m searchgym`` runs the command line."""

import sys

from searchgym.cli import main

sys.exit(main())
