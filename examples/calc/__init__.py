"""The calc example: a math agent calling a calculator through a real MCP server, trained with GRPO on a CPU.

See ``examples/calc/README.md``.
"""
