"""The console scripts' code (pyproject.toml [project.scripts]); train.py, eval/*.py and scripts/ are thin
entries into it."""
