from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

# pytest-xdist's workers share the machine's cores: one thread each, and for the processes they start
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
import torch  # noqa: E402  (after OMP_NUM_THREADS, which torch reads when it loads)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# This checkout first for the processes tests start (launchers, workers, scripts); pytest itself gets it from
# `pythonpath` in pyproject.toml.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Under pytest-xdist (pyproject's addopts: two workers, `--dist loadgroup`), the tests that start several processes
# of one run or set DeepSpeed up (accelerate's launcher and DeepSpeed listen on port 29500 unless told otherwise) run
# in turn on one worker: every test marked `multiprocess`, and every test of a module that names a launcher.
IN_TURN = pytest.mark.xdist_group("processes")
LAUNCHERS = ("accelerate.commands.launch", "torch.distributed.run", "torchrun", "--multi_gpu", "--num_processes")
LAUNCHERS += ("deepspeed",)
_LAUNCHES: dict[Path, bool] = {}


def launches(path: Path) -> bool:
    """Whether a test module's source starts a launcher of several processes."""
    if path not in _LAUNCHES:
        _LAUNCHES[path] = any(word in path.read_text(encoding="utf-8") for word in LAUNCHERS)
    return _LAUNCHES[path]


def free_port() -> str:
    """A port nothing listens on now, for a launcher's rendezvous (accelerate's default, 29500, is every launch's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("multiprocess") or launches(Path(item.fspath)):
            item.add_marker(IN_TURN)


def symmetric_targets(num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets built independently of simcse_hn.losses.targets.contrastive_targets, for the loss references.

    Rows [a, a', b, b', ...]: positive of i is i ^ 1, negatives are all rows but i and i ^ 1."""
    rows = torch.arange(num_rows)
    positive_index = rows ^ 1
    negative_mask = torch.ones(num_rows, num_rows, dtype=torch.bool)
    negative_mask[rows, rows] = False
    negative_mask[rows, positive_index] = False
    return positive_index, negative_mask


def square_targets(num_rows: int):
    """`symmetric_targets` as the training loop's ContrastiveTargets on one process: anchor i is candidate i, so its
    checked facts (anchors_are_candidates, standard_negatives) hold and the losses' shortcuts apply."""
    from simcse_hn.losses.targets import ContrastiveTargets

    positive_index, negative_mask = symmetric_targets(num_rows)
    return ContrastiveTargets(positive_index, negative_mask, anchor_index=torch.arange(num_rows))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads and lose a lot to them on a shared 2-core machine: a module
    uses this with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def numpy_alignment(x, y) -> float:
    """Alignment (Wang & Isola 2020, alpha 2) in NumPy float64: mean squared distance of normalised pair rows."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    return float(np.mean(np.sum((x - y) ** 2, axis=1)))


def numpy_uniformity(x) -> float:
    """Uniformity (t 2) in NumPy float64: log mean exp(-2 d^2) over the pairs i < j of normalised rows."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    squared = np.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)  # (N, N), every difference spelled out
    i, j = np.triu_indices(len(x), k=1)
    return float(np.log(np.mean(np.exp(-2 * squared[i, j]))))


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
