"""Cross-check a report's MTEB result files against MTEB's own evaluator; the code is simcse_hn/cli/mteb_check.py
(installed: `simcse-hn-mteb-check`)."""

import sys

from simcse_hn.cli.front import mteb_check as main  # --help and bad flags answered before the imports

if __name__ == "__main__":
    sys.exit(main())
