"""Several STS runs side by side; the code is simcse_hn/cli/compare.py (installed: `simcse-hn-compare`)."""

import sys

from simcse_hn.cli.compare import main

if __name__ == "__main__":
    sys.exit(main())
