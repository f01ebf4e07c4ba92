"""Training curves of one run or several; the code is simcse_hn/cli/curves.py (installed: `simcse-hn-curves`)."""

import sys

from simcse_hn.cli.front import curves as main  # --help and bad flags answered before the imports

if __name__ == "__main__":
    sys.exit(main())
