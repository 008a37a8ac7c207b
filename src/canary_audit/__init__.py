"""canary_audit: audit canary-memorization claims in LoRA-tuned language models."""

__version__ = "0.1.0"
