"""The model: SimCSEModel (encoder + pooler + head), loading configs and tokenizers, batching, LoRA, its folder."""
