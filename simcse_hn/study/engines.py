"""Runs past one machine through submitit (pip install 'simcse-hn[study]'): Slurm on a cluster, its LocalExecutor
or DebugExecutor on one machine. Each job is `runs.run_one`, the same function the local workers call, so a run's
record is the same whichever engine ran it (but for the machine and the times)."""

from __future__ import annotations

import os

from simcse_hn.errors import UserError
from simcse_hn.study.plan import Plan
from simcse_hn.study.runs import run_key, run_one


def run_submitit(plan: Plan, todo: list[tuple[str, int]], cluster: str | None, parameters: dict,
                 threads: int | None) -> list[str]:  # fmt: skip
    """Submit the runs as one job array (in the plan's order: seed by seed) and wait for them. `cluster`: None (Slurm
    where there is one, else local), "slurm", "local" or "debug". -> one line per failed run."""
    try:
        import submitit  # an optional extra: only where this engine is asked for
    except ImportError:
        raise UserError("--engine submitit: submitit is not installed (pip install 'simcse-hn[study]')") from None
    folder = os.path.join(plan.study_dir, "submitit")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    # submitit's own default (5 minutes, its timeout signal well before) stops a real run part-way
    try:
        executor.update_parameters(**{"timeout_min": 24 * 60, **parameters})
    except (NameError, ValueError, TypeError) as e:  # submitit's own word on a parameter it does not take
        listed = " ".join(f"{k}={v}" for k, v in parameters.items())
        raise UserError(f"--executor_param {listed}: submitit's {executor.cluster} executor refuses it: "
                        f"{str(e).strip().splitlines()[0]}") from None  # fmt: skip
    arms, seeds = [arm for arm, _ in todo], [seed for _, seed in todo]
    engine = f"submitit:{executor.cluster}"
    paths, counts, devices = [plan.path] * len(todo), [threads] * len(todo), [None] * len(todo)
    jobs = executor.map_array(run_one, paths, arms, seeds, counts, devices, [engine] * len(todo))
    failed = []
    for arm, seed, job in zip(arms, seeds, jobs):
        try:
            job.result()
        except Exception as e:  # a failed job's own message, one line
            failed.append(f"{run_key(arm, seed)}: {str(e).strip().splitlines()[-1] if str(e).strip() else e!r}")
    return failed
