"""Configuration: the command line and YAML (argument dataclasses, parser), the objective, the resolved run."""
