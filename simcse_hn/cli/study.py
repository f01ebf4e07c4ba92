"""A preregistered comparison of objectives: `simcse-hn-study plan | pilot | run | report PLAN.yaml` (docs/studies.md).

    simcse-hn-study plan study.yaml                  # check the plan, print what it can detect, lock it
    simcse-hn-study plan study.yaml --amend 'why'    # record a changed plan (or code, or data) as a new version
    simcse-hn-study pilot study.yaml                 # short runs, regime diagnostics, tuning on the dev set
    simcse-hn-study run study.yaml --jobs 2          # every run the plan lacks, seed by seed; again to resume
    simcse-hn-study run study.yaml --engine submitit # the same runs through submitit (Slurm, or local)
    simcse-hn-study report study.yaml                # blind until every run is in; then the plan's verdicts

A problem prints one `error: ...` line each and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

import yaml

from simcse_hn.cli import flag_table
from simcse_hn.cli.answers import OneLineParser
from simcse_hn.errors import UserError
from simcse_hn.study.plan_file import read_plan

if TYPE_CHECKING:
    from simcse_hn.study.plan import Plan


def build_parser() -> argparse.ArgumentParser:
    """Light on purpose, like every import at the top of this module: --help, a bad flag and a missing or malformed
    plan are answered before torch is imported (the commands import the study's modules when they run)."""
    parser = OneLineParser(prog="simcse-hn-study", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="check the plan, print what it can detect, lock it")
    plan.add_argument("plan")
    plan.add_argument("--amend", metavar="REASON", help="lock a changed plan, code or data as a new version")
    pilot = commands.add_parser("pilot", help="the pilot's runs, diagnostics and tuning; locks its picks")
    pilot.add_argument("plan")
    run = commands.add_parser("run", help="every run the plan lacks, seed by seed, every arm within a seed")
    run.add_argument("plan")
    for sub in (pilot, run):
        sub.add_argument("--jobs", type=int, default=1, help="runs at once on this machine")
        sub.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
        sub.add_argument("--gpus", default=None, help="comma-separated GPU ids, one per job (e.g. 0,1)")
    run.add_argument("--engine", choices=("local", "submitit"), default="local")
    run.add_argument("--cluster", choices=("slurm", "local", "debug"), default=None,
                     help="submitit's executor (default: Slurm where there is one, else local)")  # fmt: skip
    run.add_argument(
        "--executor_param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a submitit parameter (timeout_min=60, slurm_partition=gpu, gpus_per_node=1, ...)",
    )
    run.add_argument("--dry_run", action="store_true", help="list the starts and runs left, and stop")
    report = commands.add_parser("report", help="the report: blind until every run is in")
    report.add_argument("plan")
    report.add_argument(
        "--verdicts",
        metavar="FILE",
        default=None,
        help="verdict rules for a plan locked without any (said on the page to be given after the "
        "runs): a YAML file of `verdicts:` as a plan's and `source:`, what they were written from",
    )
    parser.flag_names += [name for sub in commands.choices.values() for name in sub.flag_names]
    return parser


def _threads(args: argparse.Namespace) -> int | None:
    if args.threads is not None:
        return args.threads
    return max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None


def _devices(args: argparse.Namespace) -> list[str] | None:
    if args.gpus is None:
        return None
    devices = [d.strip() for d in args.gpus.split(",") if d.strip()]
    if len(devices) < args.jobs:
        raise UserError(f"--gpus: {len(devices)} GPU ids for --jobs {args.jobs}; give one per job")
    return devices


def _parameters(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--executor_param: {item!r} is not KEY=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def plan_command(args: argparse.Namespace, plan: Plan) -> None:
    from simcse_hn.study import lock as locking
    from simcse_hn.study import pilot as piloting
    from simcse_hn.study.pilot_checks import check as check_pilot
    from simcse_hn.study.plan import PlanError
    from simcse_hn.study.power import power_lines
    from simcse_hn.study.tuning import dimension_notes, dimension_rows

    problems = check_pilot(plan)
    if plan.verdicts is None:
        problems.append(
            f"{plan.path}: verdicts: state what each outcome earns before any run (docs/studies.md, 'Verdicts')"
        )
    if problems:
        raise PlanError(problems)
    measured = piloting.measured_spread(plan)
    for line in power_lines(plan, measured):
        print(line)
    rows = dimension_rows(plan)
    for row in rows:
        tuned = ", ".join(f"{d} ({n} values)" for d, n in row["dimensions"].items()) or f"untuned: {row['why']}"
        print(f"tuning: {row['arm']}: {tuned}; {row['points']} grid point{'s' * (row['points'] > 1)}")
    for line in dimension_notes(rows):
        print(line)
    version = locking.lock(plan, reason=args.amend)
    print(
        f"locked: version {version['version']} ({version['stage']} stage) in "
        f"{os.path.relpath(locking.lock_path(plan))}: plan {version['plan_sha256'][:12]}, code "
        f"{version['code']['sha256'][:12]} (commit {str(version['code']['git_commit'])[:12]}"
        f"{', dirty' if version['code']['git_dirty'] else ''}), data {version['data']['sha256'][:12]}"
    )


def _echo(line: str) -> None:
    print(line, flush=True)


def run_command(args: argparse.Namespace, plan: Plan) -> int:
    from simcse_hn.study import lock as locking
    from simcse_hn.study import starts
    from simcse_hn.study.engines import run_submitit
    from simcse_hn.study.records import run_key
    from simcse_hn.study.runs import Where, pending, run_local

    devices, parameters = _devices(args), _parameters(args.executor_param)  # before the lock is read
    version = locking.check_locked(plan, stage="confirmatory")
    unscored, todo = starts.pending(plan, version), pending(plan, version)
    if plan.starts:
        print(f"starts to score: {len(unscored)} of {len(plan.starts)}", flush=True)
    print(f"runs to do: {len(todo)} of {len(plan.arms) * len(plan.seeds)}", flush=True)
    if args.dry_run:
        for key in [starts.start_key(label) for label in unscored] + [run_key(arm, seed) for arm, seed in todo]:
            print(f"  {key}")
        return 0
    # the starts first, on this machine (one eval each, on the first job's GPU): a start that cannot be scored
    # shows before the runs' hours
    where = Where(_threads(args), devices[0] if devices else None, "local")
    failed = starts.score_starts(plan, version, unscored, where, _echo)
    if args.engine == "submitit":
        failed += run_submitit(plan, todo, args.cluster, parameters, _threads(args))
    else:
        failed += run_local(plan, todo, args.jobs, _threads(args), devices, echo=_echo)
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for flag in ("jobs", "threads"):  # run's and pilot's counts: one line, not a pool's or torch's traceback
            value = getattr(args, flag, None)
            if value is not None and value < 1:
                raise UserError(f"--{flag}: at least 1, got {value}")
        read_plan(args.plan)  # a missing or malformed plan: before the imports below
        from simcse_hn.study import pilot as piloting
        from simcse_hn.study.plan import load_plan
        from simcse_hn.study.report import write_report

        # eval/sts.py's every option, from its flag table (cli.flag_table: the same as its parser's)
        options = {flag["dest"] for flag in flag_table.load("sts")["flags"] if flag["action"] != "help"}
        plan = load_plan(args.plan, check_arms=args.command == "plan", eval_options=options)
        if args.command == "plan":
            plan_command(args, plan)
        elif args.command == "pilot":
            print(piloting.run_pilot(plan, args.jobs, _threads(args), _devices(args)), end="")
        elif args.command == "run":
            return run_command(args, plan)
        else:
            page, refused = write_report(plan, args.verdicts)
            print(page, end="")
            for key, why in refused.items():
                print(f"refused: {key}: {why}", file=sys.stderr)
    except UserError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    return 0


def console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console()
