"""bench/pilot.py's regimes: the uniform share their threshold doubles; and every committed pilot
(bench/results/pilot/pilot*.json) read again from its runs gives its verdicts and its page."""

import json
from pathlib import Path

import pytest

from bench import pilot

RECORDS = sorted((Path(__file__).resolve().parent / "results" / "pilot").glob("pilot*.json"))


def test_a_queue_regime_counts_its_entries_in_the_uniform_share():
    assert pilot.queue_of("queue-k4096-m0.995") == (4096, 0.995) and pilot.queue_of("random") is None
    assert pilot.negatives_per_anchor(64, "queue-k4096-m0.995") == 126 + 4096
    assert pilot.uniform_top_share(64, "queue-k4096-m0") == 43 / 4222  # ceil(1 % of 4222) of 4222
    assert pilot.uniform_top_share(64, "random") == 2 / 126


def test_the_first_setting_to_meet_its_criterion_stands_for_the_objective():
    def run(arm, **last):
        return {"regime": "queue-k4096-m0", "arm": arm, "last": {"loss": 0.2, **last}}

    runs = [{"regime": "random", "arm": "infonce", "last": {"loss": 0.005}}, run("infonce"),
            run("hcl@hcl_beta=0.2", top1pct_weight_share=0.019), run("hcl@hcl_beta=0.5", top1pct_weight_share=0.03),
            run("dcl@dcl_tau_plus=1e-4", clamp_frac=0.9), run("dcl@dcl_tau_plus=1e-5", clamp_frac=0.2),
            run("dcl@dcl_tau_plus=1e-6", clamp_frac=0.0)]  # fmt: skip
    verdict = pilot.verdicts(runs, 64)["queue-k4096-m0"]
    assert (verdict["hcl_arm"], verdict["dcl_arm"]) == ("hcl@hcl_beta=0.5", "dcl@dcl_tau_plus=1e-5")
    assert verdict["go"] and verdict["hcl_top1pct_weight_share"] == 0.03
    runs[3]["last"]["top1pct_weight_share"] = 0.01  # no HCL setting meets it: the first stands, and it is no-go
    verdict = pilot.verdicts(runs, 64)["queue-k4096-m0"]
    assert verdict["hcl_arm"] == "hcl@hcl_beta=0.2" and not verdict["go"]


@pytest.mark.parametrize("path", RECORDS, ids=lambda path: path.name)
def test_each_committed_pilot_regenerates_from_its_runs(path):
    """The verdicts recomputed from the runs' last windows (the package's checks) equal the committed ones, and the
    page written from them equals the committed page, byte for byte."""
    record = json.loads(path.read_text(encoding="utf-8"))
    recomputed = pilot.verdicts(record["runs"], record["batch_size"])
    committed = record["verdicts"]  # pilot.json and pilot2.json were written before hcl_share_needed was recorded
    assert {regime: {k: v[k] for k in committed[regime]} for regime, v in recomputed.items()} == committed
    assert pilot.markdown({**record, "verdicts": recomputed}) == path.with_suffix(".md").read_text(encoding="utf-8")
