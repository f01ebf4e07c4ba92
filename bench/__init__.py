"""Speed and quality benches, each `python -m bench.NAME` from the checkout.

common.py holds what every speed bench shares (environment line, timing, compute limits, `write_report`: the record
as bench/results/NAME.json and its page NAME.md, which `python -m bench.report NAME.json` writes again). The quality
study is apart: quality.py schedules its training and scoring runs (file locks, resumable sittings),
quality_checks.py and quality_summary.py read what it kept.
"""
