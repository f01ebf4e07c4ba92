"""bench/encode_profile.py on a tiny encoder and the synthetic suite: the profiled batches are the encode's own, and
the record's shares are parts of one whole."""

from __future__ import annotations

import json

import bench.encode_profile as encode_profile


def test_the_quick_profile_writes_a_record_whose_shares_add_up(tmp_path, monkeypatch):
    monkeypatch.setattr(encode_profile, "RESULTS", tmp_path)
    monkeypatch.setattr(encode_profile, "bench_work_dir", lambda: tmp_path)  # the tiny encoder's folder too
    encode_profile.main(["--quick", "--batch_size", "32"])
    record = json.loads((tmp_path / "encode_profile_quick.json").read_text())
    result = record["result"]
    assert result["batches_profiled"] == 4 and result["batches_in_suite"] >= record["sentences"] // 32
    assert 0 < result["products_share"] < 1 and 0 < result["attention_share"] < 1
    assert result["products_share"] + result["attention_share"] < 1  # GELU, layer norms, copies take the rest
    assert 0 <= result["padding_share"] < 0.1  # batches of equal token length
    shares = [row["share"] for row in result["profile"]["top"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9
    page = (tmp_path / "encode_profile_quick.md").read_text()
    assert "Matrix products (addmm, mm, bmm)" in page and "aten::addmm" in page
