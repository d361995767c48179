"""agentbolt: train AI agents from the traces of their LLM calls."""

__version__ = "0.3.1"
