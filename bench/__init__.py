"""Speed and quality benches, each `python -m bench.NAME` from the checkout.

common.py holds what every speed bench shares (environment line, timing, compute limits, `write_report`: the record
as bench/results/NAME.json and its page NAME.md, which `python -m bench.report NAME.json` writes again). The lab's
studies (quality.py, study.py, pilot.py) write their pages again from the records their runs kept; a study of today
runs through `simcse-hn-study` (docs/studies.md).
"""
