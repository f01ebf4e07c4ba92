"""simcse-hn: unsupervised SimCSE sentence encoders with hard-negative objectives on the Hugging Face stack."""

__version__ = "0.1.0"
