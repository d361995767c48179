"""A stand-in for the vllm package (see tests/support/vllm_stand_in/README.md)."""

__version__ = "0.0.0+stand-in"
