"""The calc example's MCP server: one ``calculate`` tool, served over stdio.

The agent starts it as a subprocess for each rollout (``python calculator_server.py``) and talks to it with the MCP
client, exactly as it would with any MCP server (the reference example uses ``mcp-server-calculator`` the same way).
The expression is evaluated by a safe arithmetic evaluator (numbers, ``+ - * /`` and parentheses only): no names,
no calls, bounded magnitudes. Errors come back as the tool's text result, so the model sees them.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from agentbolt.demo.agent import CalculatorError
from agentbolt.demo.agent import calculate as evaluate

server = MCPServer("calculator")


@server.tool()
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, for example '24 * 36'."""
    try:
        return evaluate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"


if __name__ == "__main__":
    server.run("stdio")
