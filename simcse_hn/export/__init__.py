"""Export: the model card, the Hugging Face Hub, and the objectives as sentence-transformers losses."""
