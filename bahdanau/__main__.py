"""`python -m bahdanau` runs the command-line interface."""

import sys

from bahdanau.cli import main

sys.exit(main())
