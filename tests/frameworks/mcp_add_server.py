"""An MCP tool server over stdio with one tool, ``add``: what the framework tests' agents call through MCP."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
