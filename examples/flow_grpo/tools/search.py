"""Offline search: BM25 over the local corpus shipped with the example (stands in for Wikipedia/web search)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from examples.flow_grpo.tools.base import Tool, ToolMetadata, ToolResult

__all__ = ["BM25Index", "Document", "SearchTool", "load_corpus", "stem", "tokenize"]

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.jsonl"
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "the",
        "this",
        "that",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "why",
        "with",
    ]
)


_SUFFIXES = ("ation", "ion", "ing", "ers", "er", "ed", "es", "s", "e")


def stem(token: str) -> str:
    """A light suffix-stripping stem (``lived``, ``lives``, ``live`` -> ``liv``; ``building`` -> ``build``), so a
    question's word finds a passage that inflects it differently. Numbers and short words are kept as they are."""
    if token.isdigit():
        return token
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            return token[: -len(suffix)]
    return token


def tokenize(text: str) -> List[str]:
    """Lower-cased, stemmed alphanumeric tokens without common English stop words."""
    return [stem(token) for token in re.findall(r"[a-z0-9]+", text.lower()) if token not in _STOPWORDS]


@dataclass(frozen=True)
class Document:
    """A corpus entry."""

    doc_id: str
    title: str
    text: str


def load_corpus(path: Union[str, Path] = DEFAULT_CORPUS) -> List[Document]:
    """Read a JSONL corpus with ``id``, ``title`` and ``text`` fields.

    Raises:
        ValueError: A line is not a JSON object with those fields (the message names the line).
    """
    documents = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            documents.append(Document(str(record["id"]), str(record["title"]), str(record["text"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a corpus record ({exc})") from None
    return documents


class BM25Index:
    """Okapi BM25 ranking (Robertson/Sparck Jones idf with the usual +1 smoothing so it stays positive).

    Args:
        documents: The corpus; title and text are indexed together.
        k1: Term-frequency saturation.
        b: Length normalisation.
    """

    def __init__(self, documents: Sequence[Document], k1: float = 1.5, b: float = 0.75) -> None:
        self.documents = list(documents)
        self.k1 = k1
        self.b = b
        self._frequencies = [Counter(tokenize(f"{d.title} {d.text}")) for d in self.documents]
        self._lengths = [sum(f.values()) for f in self._frequencies]
        self._average = sum(self._lengths) / len(self._lengths) if self._lengths else 0.0
        document_frequency: Counter[str] = Counter()
        for frequencies in self._frequencies:
            document_frequency.update(frequencies.keys())
        n = len(self.documents)
        self._idf: Dict[str, float] = {
            term: math.log(1 + (n - df + 0.5) / (df + 0.5)) for term, df in document_frequency.items()
        }

    def search(
        self, query: str, k: int = 3, where: Optional[Callable[[Document], bool]] = None
    ) -> List[Tuple[Document, float]]:
        """The ``k`` best documents with a positive score, best first (ties keep corpus order); with ``where``,
        only documents it accepts."""
        terms = tokenize(query)
        scored = []
        for index, frequencies in enumerate(self._frequencies):
            if where is not None and not where(self.documents[index]):
                continue
            score = 0.0
            norm = self.k1 * (1 - self.b + self.b * self._lengths[index] / (self._average or 1.0))
            for term in terms:
                tf = frequencies.get(term, 0)
                if tf:
                    score += self._idf[term] * tf * (self.k1 + 1) / (tf + norm)
            if score > 0:
                scored.append((score, index))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [(self.documents[index], score) for score, index in scored[:k]]


class SearchTool(Tool):
    """Searches the local corpus and returns the best passages.

    Args:
        corpus: Path of a JSONL corpus, or documents; defaults to the corpus shipped with the example.
        k: Passages returned per query (default 1: with one passage a small model reading the result cannot pick
            a distractor's value).
    """

    metadata = ToolMetadata(
        name="search",
        description="Looks up one fact about a person, place, building or event in an encyclopedia; a second "
        "search continues from what the last step found.",
        input_description="The sub-goal, copied word for word.",
        examples=(
            (
                "none",
                "Which lake lies next to the town where the Iron Treaty was signed?",
                "Which lake lies next to the town where the Iron Treaty was signed?",
            ),
        ),
        aliases=("web_search", "encyclopedia", "lookup"),
    )

    def __init__(self, corpus: Union[str, Path, Sequence[Document], None] = None, k: int = 1) -> None:
        if corpus is None or isinstance(corpus, (str, Path)):
            documents = load_corpus(corpus or DEFAULT_CORPUS)
        else:
            documents = list(corpus)
        self.index = BM25Index(documents)
        self.k = k

    def run(self, tool_input: str) -> ToolResult:
        """Return the text of the top passages (each names its subject), or say that nothing matched."""
        hits = self.index.search(tool_input, k=self.k)
        if not hits:
            return ToolResult(f"No passage matches {tool_input.strip()!r}.", ok=False)
        return ToolResult("\n".join(doc.text for doc, _ in hits))

    def follow_up(self, question: str, last_result: Callable[[], str]) -> Tool:
        """This search bound to one solve of ``question``; ``last_result()`` gives the solve's newest tool result.

        A multi-hop question names one entity and asks about another that a first step finds ("the city where the
        Comet Regatta was held"). The bound search follows that link: when the newest result names an entity the
        question does not (a passage title sharing a word with the result but not with the question), it looks
        among that entity's passages, ranked by the query together with the result; otherwise it searches the whole
        corpus with the query and the result. It never returns a passage the solve has already seen, so a second
        search moves on instead of repeating the first.
        """
        return _FollowUpSearch(self, question, last_result)


class _FollowUpSearch(Tool):
    """A :class:`SearchTool` bound to one solve (see :meth:`SearchTool.follow_up`)."""

    metadata = SearchTool.metadata

    def __init__(self, search: SearchTool, question: str, last_result: Callable[[], str]) -> None:
        self._search = search
        self._question_terms = set(tokenize(question))
        self._last_result = last_result
        self._seen: Set[str] = set()

    def run(self, tool_input: str) -> ToolResult:
        """The best unseen passage, about the entity the newest result introduced when there is one."""
        context = self._last_result()
        new_terms = set(tokenize(context)) - self._question_terms

        def unseen(doc: Document) -> bool:
            return doc.doc_id not in self._seen

        def about_new_entity(doc: Document) -> bool:
            return unseen(doc) and bool(new_terms & set(tokenize(doc.title)))

        query = f"{tool_input} {context}"
        hits = self._search.index.search(query, k=self._search.k, where=about_new_entity) if new_terms else []
        hits = hits or self._search.index.search(query, k=self._search.k, where=unseen)
        if not hits:
            return ToolResult(f"No passage matches {tool_input.strip()!r}.", ok=False)
        self._seen.update(doc.doc_id for doc, _ in hits)
        return ToolResult("\\n".join(doc.text for doc, _ in hits))
