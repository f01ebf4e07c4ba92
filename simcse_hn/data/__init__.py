"""Data: training sentences and pairs (file formats), the collators, batch samplers, the guide model, STS files."""
