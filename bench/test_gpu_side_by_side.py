"""bench/gpu.py's side-by-side section: every configuration of one batch size trains the same encoder, data, length,
precision, optimizer and learning rate, the two sentence-transformers runs differ only by its fast settings, and
the compiled one runs last."""

from __future__ import annotations

from bench.gpu import ST_FAST, side_by_side_specs

SHARED = ("model", "batch", "max_length", "steps", "warmup", "bf16")


def test_sides_share_every_setting_but_their_own():
    specs = side_by_side_specs("folder", cpu_check=False, threads=4)
    for batch in (64, 512):
        mine = [s for s in specs if s["batch"] == batch]
        assert {s["name"] for s in mine} == {f"{n}-b{batch}" for n in ("st-mnrl", "st-mnrl-fast", "ours-avg",
                                                                         "ours-cls")}  # fmt: skip
        assert len({tuple(s[k] for k in SHARED) for s in mine}) == 1
        assert all(s["bf16"] and s["max_length"] == 32 for s in mine)
        assert mine[-1]["name"] == f"st-mnrl-fast-b{batch}" and mine[-1]["st_arguments"] == ST_FAST
        assert all("st_arguments" not in s for s in mine[:-1])
        ours_avg = next(s for s in mine if s["name"].startswith("ours-avg"))
        assert ours_avg["args"] == ["--pooler", "avg", "--loss", "infonce", "--contrast_form", "simcse"]
    rounds = [s["round"] for s in specs if s["name"] == "st-mnrl-b64"]
    assert rounds == [0, 1]  # batch 64 interleaved over two rounds


def test_cpu_check_compiles_with_a_cpu_backend():
    specs = side_by_side_specs("folder", cpu_check=True, threads=1)
    fast = [s for s in specs if s["name"].startswith("st-mnrl-fast")]
    assert fast and all(s["st_arguments"]["torch_compile_backend"] == "aot_eager" for s in fast)
    assert not any(s["bf16"] for s in specs)
