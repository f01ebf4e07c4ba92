"""Evaluation: STS scoring and encoding, result files and reports, charts, statistics, MTEB result files."""
