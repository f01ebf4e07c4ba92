"""Preregistered multi-seed comparisons of objectives (`simcse-hn-study plan | pilot | run | report`): a plan the
user writes (plan.py), locked with its code and data before any run (lock.py), runs that are ordinary train.py +
eval/sts.py pairs (runs.py, engines.py), a pilot that checks the regime and tunes on a dev set (pilot.py) and a report
that shows nothing comparing arms before every run is in (report.py, tests in analysis.py). docs/studies.md."""
