"""The word-level chat model of the full-stack tests, shared from :mod:`support.word_model`."""

from support.word_model import CHAT_TEMPLATE, WORDS, ask, build_word_model, fit

__all__ = ["CHAT_TEMPLATE", "WORDS", "ask", "build_word_model", "fit"]
