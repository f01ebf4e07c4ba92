"""The STS suite for a SimCSE folder, a Hub id or a sentence-transformers model; the code is simcse_hn/cli/sts.py
(installed: `simcse-hn-sts`)."""

import importlib.util
import sys
from pathlib import Path

# A report records the code that produced it, so a checkout's eval/sts.py scores with that checkout's simcse_hn, never
# an installed copy (tests/test_provenance.py): the package is loaded from its folder beside eval/, by location.
PACKAGE = Path(__file__).resolve().parents[1] / "simcse_hn"
spec = importlib.util.spec_from_file_location("simcse_hn", PACKAGE / "__init__.py",
                                              submodule_search_locations=[str(PACKAGE)])  # fmt: skip
sys.modules["simcse_hn"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["simcse_hn"])

from simcse_hn.cli.front import sts as main  # noqa: E402  (answers --help and bad flags before torch is imported)

if __name__ == "__main__":
    sys.exit(main(script=__file__))
