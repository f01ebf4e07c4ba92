"""Cross-check a report's MTEB result files against MTEB's own evaluator; the code is simcse_hn/cli/mteb_check.py
(installed: `simcse-hn-mteb-check`)."""

import sys

from simcse_hn.cli.mteb_check import main

if __name__ == "__main__":
    sys.exit(main())
