"""Several STS runs side by side; the code is simcse_hn/cli/compare.py (installed: `simcse-hn-compare`)."""

import sys

from simcse_hn.cli.front import compare as main  # --help and bad flags answered before the imports

if __name__ == "__main__":
    sys.exit(main())
