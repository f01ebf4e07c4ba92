"""The STS suite for a SimCSE folder, a Hub id or a sentence-transformers model; the code is simcse_hn/cli/sts.py
(installed: `simcse-hn-sts`)."""

import os
import sys

# The one entry that puts its checkout first: a report records the code that produced it, so a checkout's
# eval/sts.py scores with that checkout's simcse_hn, never an installed copy (tests/test_provenance.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simcse_hn.cli.sts import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(script=__file__))
