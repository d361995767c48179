"""The search_r1 example: multi-turn search-then-answer with ``<search>`` tags over the rag example's corpus.

See ``examples/search_r1/README.md``.
"""
