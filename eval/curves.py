"""Training curves of one run or several; the code is simcse_hn/cli/curves.py (installed: `simcse-hn-curves`)."""

import sys

from simcse_hn.cli.curves import main

if __name__ == "__main__":
    sys.exit(main())
