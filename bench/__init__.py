"""Speed and quality benches: `python -m bench.NAME` from the checkout (bench/results/ holds what they wrote)."""
