"""What each outcome earns, as the plan states it before any run: the report writes these sentences word for word and
no other verdict.

    verdicts:
      margin: 0.2                 # equivalence margin, endpoint points: needed for `equivalent` and `inconclusive`
      equivalence: tost           # tost: both one-sided exact tests reject at alpha / m (the simultaneous level);
                                  # intervals: no difference shown and the 95 % t-interval and the simultaneous
                                  # interval both inside +-margin
      rules:                      # every rule whose outcomes all hold is written
        - when: {hcl: better, unremix: better}
          say: "HCL and UnReMix beat InfoNCE in this regime."
        - when: {hcl: equivalent}
          say: "HCL is equivalent to InfoNCE within 0.2 points."

An outcome of a comparison (an arm against the baseline; `plan-name: arm` for a plan of the family): `better` or
`worse` (the Holm-adjusted exact sign-flip p below alpha, and the sign of the mean difference), `differs` (either),
`not_shown` (not differs), `equivalent` (by the plan's `equivalence` rule at its margin), `inconclusive` (neither
differs nor equivalent). With a family, the outcomes are read from the family's Holm (the confirmatory reading)."""

from __future__ import annotations

from collections.abc import Callable

OUTCOMES = ("better", "worse", "differs", "not_shown", "equivalent", "inconclusive")
NEEDS_MARGIN = ("equivalent", "inconclusive")
EQUIVALENCE = ("tost", "intervals")
KEYS = ("margin", "equivalence", "rules")
NO_RULE = "No rule of the plan holds for these outcomes: the plan earns no verdict here."


def check(
    raw, comparisons: list[str] | None, problem: Callable[[tuple, str], None], where: tuple = ("verdicts",)
) -> None:
    """The verdict rules' problems, one `problem(where, message)` each: unknown keys, a comparison the plan does not
    make, an outcome it does not know, `equivalent` without a margin, a rule without words."""
    if not isinstance(raw, dict):
        problem(where, "a mapping with rules (and margin, equivalence); see docs/studies.md")
        return
    for key in raw:
        if key not in KEYS:
            problem((*where, key), f"unknown key; the keys are {', '.join(KEYS)}")
    margin = raw.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin <= 0):
        problem((*where, "margin"), f"the equivalence margin in endpoint points (> 0), got {margin!r}")
    if raw.get("equivalence", "tost") not in EQUIVALENCE:
        problem((*where, "equivalence"), f"{raw['equivalence']!r}: one of {', '.join(EQUIVALENCE)}")
    rules = raw.get("rules")
    if not isinstance(rules, list) or not rules:
        problem((*where, "rules"), "a list of {when: {comparison: outcome}, say: words}, one rule or more")
        return
    for i, rule in enumerate(rules):
        at = (*where, "rules", i)
        if not isinstance(rule, dict) or set(rule) != {"when", "say"}:
            problem(at, "a rule is {when: {comparison: outcome, ...}, say: the verdict's words}")
            continue
        if not isinstance(rule["say"], str) or not rule["say"].strip():
            problem(at, "say: the verdict's words, a non-empty string")
        when = rule["when"]
        if not isinstance(when, dict) or not when:
            problem(at, "when: {comparison: outcome, ...}, one comparison or more")
            continue
        for name, outcome in when.items():
            if comparisons is not None and name not in comparisons:
                problem(at, f"when: {name!r} is not a comparison of the plan ({', '.join(comparisons)})")
            if outcome not in OUTCOMES:
                problem(at, f"when: {name}: {outcome!r} is not an outcome ({', '.join(OUTCOMES)})")
            elif outcome in NEEDS_MARGIN and margin is None:
                problem(at, f"when: {name}: {outcome!r} needs verdicts.margin, the equivalence margin")


def comparisons(own: str, arms: list[str], members: dict[str, list[str]]) -> list[str]:
    """The names a rule may give a comparison: the plan's own arms by name, and with a family every comparison as
    `plan-name: arm` (the plan's own included)."""
    names = list(arms)
    if members:
        names += [f"{own}: {arm}" for arm in arms]
        names += [f"{plan}: {arm}" for plan, its in members.items() for arm in its]
    return names


def outcomes_of(v: dict, alpha: float, level: float, margin: float | None, equivalence: str) -> list[str]:
    """The outcomes one comparison's tests earn."""
    found = []
    if v["differs"]:
        found += ["differs", "better" if v["difference"] > 0 else "worse"]
    else:
        found.append("not_shown")
    if margin is not None:
        if equivalence == "tost":
            equivalent = v["tost"]["p"] < level
        else:
            s = v["simultaneous"]
            equivalent = not v["differs"] and all(
                -margin < x < margin for x in (v["low"], v["high"], s["low"], s["high"])
            )
        found.append("equivalent" if equivalent else "inconclusive" if not v["differs"] else "")
    return [o for o in found if o]


def read(rules: dict, own: str, table: dict, family: bool) -> dict:
    """The rules applied to the comparisons' tests (`table`: compare's or compare_family's record). -> {"outcomes":
    {comparison: [outcome, ...]}, "verdicts": [{"rule": i, "when", "say"}], "margin", "equivalence"}"""
    margin, equivalence = rules.get("margin"), rules.get("equivalence", "tost")
    outcomes = {
        name: outcomes_of(v, table["alpha"], table["level"], margin, equivalence) for name, v in table["tests"].items()
    }

    def holds(name: str, outcome: str) -> bool:
        key = f"{own}: {name}" if family and ": " not in name else name
        if not family and key.startswith(f"{own}: "):
            key = key[len(own) + 2 :]
        return outcome in outcomes.get(key, [])

    said = [
        {"rule": i + 1, "when": rule["when"], "say": rule["say"]}
        for i, rule in enumerate(rules["rules"])
        if all(holds(name, outcome) for name, outcome in rule["when"].items())
    ]
    return {"outcomes": outcomes, "verdicts": said, "margin": margin, "equivalence": equivalence}


def section(record: dict) -> list[str]:
    """The page's verdicts: the plan's sentences that hold, word for word, and the outcomes they were read from."""
    lines = ["", "## Verdicts: the plan's rules, word for word", ""]
    given = record.get("verdict_rules")
    if given is None:
        return [*lines, "The plan states no verdict rules: nothing on this page is a verdict."]
    if given["source"] != "plan":
        lines += [
            f"These rules were not locked with the plan: they were given to `report` after the runs, from "
            f"{given['source']} ({given['note']}).",
            "",
        ]
    read_ = record.get("verdicts")
    if read_ is None:
        return [*lines, "No verdict before every run is in."]
    how = (
        "TOST, both one-sided exact sign-flip tests at the simultaneous level"
        if read_["equivalence"] == "tost"
        else "no difference shown and the 95 % t-interval and the simultaneous interval inside the margin"
    )
    margin = f"; equivalence within ±{read_['margin']:g}: {how}" if read_["margin"] is not None else ""
    table = record.get("family_comparison") or record["comparison"]
    lines += [
        f"Outcomes by the plan's test (exact sign-flip, two-sided), Holm over {table['m']} comparison"
        f"{'s' * (table['m'] > 1)} at {table['alpha']:g}{margin}:",
        "",
        "| comparison | outcome |",
        "|---|---|",
        *[f"| {name} | {', '.join(found)} |" for name, found in read_["outcomes"].items()],
        "",
    ]
    if not read_["verdicts"]:
        return [*lines, NO_RULE]
    for v in read_["verdicts"]:
        condition = ", ".join(f"{name} {outcome}" for name, outcome in v["when"].items())
        lines += [f"{v['say']}", "", f"(rule {v['rule']}: {condition})", ""]
    return lines[:-1]
