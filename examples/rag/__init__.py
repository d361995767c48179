"""The rag example: an agent answering from a local corpus through an MCP retrieval tool, trained with GRPO.

See ``examples/rag/README.md``. The corpus, its questions and BM25 retrieval (:mod:`examples.rag.corpus`) are shared
with the search_r1 example.
"""
