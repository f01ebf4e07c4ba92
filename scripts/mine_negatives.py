"""Mine hard negatives for a pair dataset; the code is simcse_hn/cli/mine_negatives.py (installed:
`simcse-hn-mine`)."""

import sys

from simcse_hn.cli.mine_negatives import main

if __name__ == "__main__":
    sys.exit(main())
