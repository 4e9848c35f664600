"""`python -m trioloop` runs the command line."""

import sys

from trioloop.cli import main

sys.exit(main())
