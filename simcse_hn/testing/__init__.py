"""Test support built in code: tiny models and tokenizers (models.py), a host-tensor recorder for the loss
path (recorder.py) and a Hugging Face Hub stand-in on 127.0.0.1 (hub_server.py). Nothing is downloaded."""
