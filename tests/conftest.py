from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(ROOT))  # train.py and eval/ live at the top level


@pytest.fixture
def tiny_args(tmp_path):
    """Arguments of a fast debug_tiny run writing into tmp_path."""
    return [
        "--config",
        str(ROOT / "configs" / "debug_tiny.yaml"),
        "--train_file",
        str(FIXTURES / "tiny_corpus.txt"),
        "--eval_file",
        str(FIXTURES / "sts_tiny.jsonl"),
        "--output_dir",
        str(tmp_path / "out"),
        "--disable_tqdm",
        "true",
    ]
