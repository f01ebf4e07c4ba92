"""The hardest in-batch negatives and each objective's weight on them; the code is simcse_hn/cli/negatives.py
(installed: `simcse-hn-negatives`)."""

import sys

from simcse_hn.cli.negatives import main

if __name__ == "__main__":
    sys.exit(main())
