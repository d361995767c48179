"""The rag example's MCP server: a ``retrieve`` tool over the shipped corpus (BM25), served over stdio.

It stands where the reference example's Wikipedia retriever (a FAISS index behind MCP) stands; the agent talks to
it with the MCP client. ``retrieve(query, top_k=1)`` returns the best passages as ``title: text`` lines, or
``no passage found`` when the query has no searchable word.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from examples.rag.corpus import Retriever

server = MCPServer("retriever")
retriever = Retriever()


@server.tool()
def retrieve(query: str, top_k: int = 1) -> str:
    """Search the encyclopedia for passages about the query (names and key words work best)."""
    passages = retriever.search(query, top_k=max(1, min(int(top_k), 5)))
    if not passages:
        return "no passage found"
    return "\n".join(f"{p['title']}: {p['text']}" for p in passages)


if __name__ == "__main__":
    server.run("stdio")
