"""Supervised fine-tuning of a math agent with a calculator tool, ported from the reference's Unsloth example."""
