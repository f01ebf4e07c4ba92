"""What makes STS scores one measurement: runs scored under another protocol, on other tasks or data, with another
pooler or input length are not replicates of each other, whatever their objective and seed.

`scoring_fields` reads these from results records (results.json, or an MTEB folder read by mteb_results.load_run);
`scored_alike` keeps eval/compare.py's groups to runs that agree on every one; `group_names` gives its default groups
(one per objective) and `settings_notes` what else differs inside one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from simcse_hn.data.sts import STS_TASKS, STSTask
from simcse_hn.errors import DataError
from simcse_hn.evaluation.reports import protocol
from simcse_hn.run_record import RunRecord

FIELDS = ("protocol", "tasks", "data", "pooler", "max_seq_length")
WORDS = {"protocol": "protocols", "tasks": "tasks", "data": "data", "pooler": "poolers",
         "max_seq_length": "input lengths (max_seq_length)"}  # fmt: skip
# fields of a training record that say nothing of the objective or its budget: random ids, derived values, when
TRAINING_NOISE = frozenset({"optimisation.seed", "run_id", "model.license", "provenance.started", "record_version"})


def flat_record(training: dict | None) -> dict[str, object]:
    """A training record (of any version) as {field path: value}, sections and mappings opened."""
    flat: dict[str, object] = {}

    def walk(value: object, path: str) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else key)
        else:
            flat[path] = value

    if training:
        walk(RunRecord.from_json(training).to_json(), "")
    return flat


def data_fingerprint(task: STSTask) -> str:
    """sha256 (16 hex digits) of a task's pairs as scored: sentence1, sentence2 and gold score of each, in order."""
    digest = hashlib.sha256()
    for pairs in task.subsets.values():
        for row in zip(pairs.sentence1, pairs.sentence2, pairs.scores):
            digest.update(json.dumps(row).encode("utf-8"))
    return digest.hexdigest()[:16]


def _data(results: dict, hashed: bool) -> str:
    if results.get("aggregation") == "mteb":  # MTEB's copies, at the revision each file names
        revisions = (results.get("settings") or {}).get("dataset_revisions") or {}
        return "MTEB datasets " + ", ".join(f"{t} @{str(r)[:7]}" for t, r in revisions.items())
    if hashed:
        hashes = results["settings"]["data_sha256"]
        return ", ".join(f"{task} sha256 {hashes[task]}" for task in results["tasks"])
    cells = []
    for task, scored in results["tasks"].items():
        subsets = scored.get("subsets") or {}
        parts = [f"{name} {s.get('pairs')}" for name, s in subsets.items()] if len(subsets) > 1 else []
        cells.append(f"{task} {scored.get('pairs')} pairs" + (f" ({', '.join(parts)})" if parts else ""))
    return ", ".join(cells)


def scoring_fields(records: Sequence[dict]) -> tuple[list[dict[str, str]], list[str]]:
    """-> ({field: value} per record, for the FIELDS every record states; notes on the fields some do not state,
    which are then not compared). Data: the pairs' sha256 where every record has it (eval/sts.py writes
    settings.data_sha256), else the pair counts per task and sub-file."""
    hashed = all(
        r.get("aggregation") == "mteb" or set(r["tasks"]) <= set((r.get("settings") or {}).get("data_sha256") or {})
        for r in records
    )
    notes = []
    lengths = [(r.get("settings") or {}).get("max_seq_length") for r in records]
    check_length = all(length is not None for length in lengths)
    if not check_length and any(length is not None for length in lengths):
        notes.append("max_seq_length is not recorded by every run, so it is not compared")
    out = []
    for r, length in zip(records, lengths):
        fields = {
            "protocol": protocol(r),
            "tasks": ", ".join(t for t in STS_TASKS if t in r["tasks"]) or "none",
            "data": _data(r, hashed),
            "pooler": str(r.get("pooler") or ("unknown" if r.get("aggregation") == "mteb" else "model's own modules")),
        }
        if check_length:
            fields["max_seq_length"] = str(length)
        out.append(fields)
    return out, notes


def differences(fields: Sequence[dict[str, str]]) -> dict[str, list[str]]:
    """{field: its distinct values, in order} for each field on which the records differ."""
    out = {}
    for field in FIELDS:
        values = list(dict.fromkeys(f[field] for f in fields if field in f))
        if len(values) > 1:
            out[field] = values
    return out


def describe(differing: dict[str, list[str]]) -> str:
    """'different protocols (a | b); different poolers (cls | avg)'"""
    return "; ".join(f"different {WORDS[field]} ({' | '.join(values)})" for field, values in differing.items())


def scored_alike(runs: list[dict], split: bool, baseline: str | None) -> list[str]:
    """runs: eval/compare.py's [{"results", "group", "seed", ...}], their "group" rewritten where a group is split.
    Keep every group to runs scored alike (comparability.FIELDS): split a mixed group when `split` (the default
    grouping), else refuse it; refuse a mixed baseline, and a group tested against a baseline (a seed in common) that
    was scored otherwise; a group of other scoring with no seed in common sits beside it, untested. -> notes"""
    fields, notes = scoring_fields([run["results"] for run in runs])
    for run, scoring in zip(runs, fields):
        run["scoring"] = scoring
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(run["group"], []).append(run)
    for name, members in groups.items():
        differing = differences([m["scoring"] for m in members])
        if not differing:
            continue
        if not split or name == baseline:
            what = "the baseline" if name == baseline else "group"
            raise DataError(f"{what} {name!r} mixes runs scored differently, {describe(differing)}: statistics "
                            "across them would mean nothing")  # fmt: skip
        for m in members:
            m["group"] = f"{name} [{', '.join(m['scoring'][field] for field in differing)}]"
        parts = len({m["group"] for m in members})
        notes.append(f"{name}: split into {parts} groups, never pooled: {describe(differing)}")
    if baseline is None or baseline not in groups:
        return notes
    base = groups[baseline]
    base_seeds = {str(m["seed"]) for m in base if m["seed"] is not None}
    tested: dict[str, list[dict]] = {}
    for run in runs:
        tested.setdefault(run["group"], []).append(run)
    for name, members in tested.items():
        differing = differences([base[0]["scoring"], members[0]["scoring"]])
        if name == baseline or not differing:
            continue
        if base_seeds & {str(m["seed"]) for m in members if m["seed"] is not None}:
            raise DataError(f"{name} and the baseline {baseline}: {describe(differing)}: statistics across them "
                            "would mean nothing")  # fmt: skip
        notes.append(f"{name}: beside {baseline}, not tested against it ({describe(differing)})")
    return notes


# --- eval/compare.py's default groups: one per objective ---


def objective_settings(training: dict | None) -> dict | None:
    """What makes a run's objective (its training record, of any version): its loss, contrast form, temperature and
    options; None for a run without a record."""
    if not training:
        return None
    method = RunRecord.from_json(training).method
    if method.loss is None:
        return None
    temperature = {} if method.temperature is None else {"temperature": method.temperature}
    return {"loss": method.loss, "contrast_form": method.contrast_form, **temperature, **method.options}


def group_names(runs: list[dict]) -> list[str]:
    """A name per run: its objective's loss, with the settings that tell it from other groups of the same loss."""
    settings = [objective_settings(run["results"].get("training")) for run in runs]
    keys = [None if s is None else json.dumps(s, sort_keys=True) for s in settings]
    fields = {key: {k: v for k, v in s.items() if k != "loss"} for key, s in zip(keys, settings) if key is not None}
    names = []
    for key, run, setting in zip(keys, runs, settings):
        if key is None:
            names.append(run["label"])
            continue
        loss = setting["loss"]
        rivals = [other for other in fields if other != key and json.loads(other)["loss"] == loss]
        differing = [f for f in fields[key] if any(fields[other].get(f) != fields[key][f] for other in rivals)]
        names.append(loss + (" (" + ", ".join(f"{f} {fields[key][f]}" for f in differing) + ")" if differing else ""))
    return names


def settings_notes(group: str, members: list[dict]) -> list[str]:
    """What differs inside a group besides the seed (base model, learning rate, ...): a reviewer's first question."""
    trainings = [flat_record(m["results"].get("training")) for m in members]
    keys = sorted({k for t in trainings for k in t} - TRAINING_NOISE)  # run ids differ in every group
    notes = []
    for key in keys:
        values = [json.dumps(t.get(key), sort_keys=True) for t in trainings]
        if len(set(values)) > 1:
            notes.append(f"{group}: runs differ in {key} ({', '.join(dict.fromkeys(values))})")
    seeds = [m["seed"] for m in members]
    if len(members) > 1 and None in seeds:
        notes.append(f"{group}: seed unknown for {sum(s is None for s in seeds)} run(s); no pairing by seed for them")
    if len([s for s in seeds if s is not None]) != len({s for s in seeds if s is not None}):
        notes.append(f"{group}: a seed appears more than once (checkpoints of one run?); the statistics use the "
                     "first run of each seed")  # fmt: skip
    return notes
