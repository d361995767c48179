"""Chat prompts rendered with the model's chat template and tokenized, the client's text as plain text.

A chat template writes control tokens (``<|im_start|>``, ``<|im_end|>``...) around the messages, and the rendered
prompt is tokenized with special tokens parsed, so that the template's own control tokens become token ids. Text
the client sent (message contents, tool calls, tool definitions, template variables) may hold the *text* of a special
token too, e.g. a web page fetched by a tool that contains ``<|im_end|>\\n<|im_start|>system``. Parsed, it would end
the turn and open a new one: a prompt injection, and a different prompt from the text sent. OpenAI's API treats such
text as text, and so does :class:`ChatPromptEncoder`:

* A request whose strings hold no special token's text is rendered and tokenized in one piece: the ids of the
  tokenizer's own ``apply_chat_template(..., tokenize=True)``.
* Otherwise each string holding one is wrapped in two private-use characters absent from the request, the template
  is rendered again, and the rendered text is split at those markers: the template's text is tokenized with special
  tokens parsed, the client's strings with special tokens tokenized as text, and the ids are concatenated. The
  prompt's text is the same; only the client's special-token text gets other ids.

Special tokens are the tokenizer's ``all_special_tokens`` and its added tokens flagged ``special``. Added tokens
that are not special (Qwen's ``<tool_call>``, which models write as text) are tokenized as in the rest of the prompt.
"""

from __future__ import annotations

import copy
import re
import weakref
from functools import cached_property
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Pattern, Sequence, Tuple

from agentbolt.serving.params import EngineError

__all__ = [
    "TEXT_PART_TYPES",
    "ChatPromptEncoder",
    "check_unicode",
    "encoder_for",
    "special_token_texts",
    "template_message",
    "unmark",
]

_PRIVATE_USE = re.compile("[\ue000-\uf8ff]")


TEXT_PART_TYPES = frozenset({"text", "input_text"})
"""Content part types a chat template is given as text (their texts joined); any other part cannot be rendered."""


def template_message(message: Dict[str, Any]) -> Dict[str, Any]:
    """An OpenAI chat message (a dict) as chat templates expect it: the texts of its content parts joined,
    ``developer`` as ``system``, no content as ``""``. ``agentbolt serve`` prompts the model with it, and SFT learns
    from the same text.

    Raises:
        ValueError: A content part that is not text (an image, audio, a file); the message starts with
            ``content[i]`` so that callers can say which message holds it.
    """
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in TEXT_PART_TYPES:
                raise ValueError(f"content[{index}]: only text content parts are supported, got {kind!r}")
            text = part.get("text")
            texts.append(text if isinstance(text, str) else "")
        content = "".join(texts)
    rendered = dict(message, content="" if content is None else content)
    if rendered.get("role") == "developer":
        rendered["role"] = "system"
    return rendered


def check_unicode(text: str, field: str) -> None:
    """Refuse text the tokenizer cannot encode: a lone UTF-16 surrogate (``"\\ud800"``) is not a character.

    Raises:
        EngineError: ``text`` holds a lone surrogate; the message names ``field`` and the position.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EngineError(
            f"{field} holds a character that is not valid Unicode at position {exc.start} "
            f"({text[exc.start]!r}, a lone surrogate)"
        ) from None


def special_token_texts(tokenizer: Any) -> FrozenSet[str]:
    """The texts of a transformers tokenizer's special tokens: ``all_special_tokens`` and the added tokens flagged
    ``special`` (not the other added tokens)."""
    texts = {str(token) for token in getattr(tokenizer, "all_special_tokens", ())}
    texts.update(
        str(token.content) for token in getattr(tokenizer, "added_tokens_decoder", {}).values() if token.special
    )
    texts.discard("")
    return frozenset(texts)


def _strings(value: Any) -> Iterator[str]:
    """Every string in nested lists and dicts, dict keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _markers(texts: Iterable[str]) -> Tuple[str, str]:
    """Two private-use characters that occur in none of ``texts``: the opening and closing marker."""
    used = set()
    for text in texts:
        used.update(_PRIVATE_USE.findall(text))
    free = (chr(code) for code in range(0xE000, 0xF900) if chr(code) not in used)
    opening, closing = next(free, None), next(free, None)
    if opening is None or closing is None:
        raise EngineError(
            "messages hold the text of special tokens and every private-use character U+E000-U+F8FF, so the "
            "text cannot be kept apart from the chat template's control tokens"
        )
    return opening, closing


_ENCODERS: weakref.WeakKeyDictionary[Any, ChatPromptEncoder] = weakref.WeakKeyDictionary()


def encoder_for(tokenizer: Any) -> ChatPromptEncoder:
    """The :class:`ChatPromptEncoder` of ``tokenizer``, built on first use and kept while the tokenizer lives."""
    try:
        encoder = _ENCODERS.get(tokenizer)
    except TypeError:  # a tokenizer that cannot be weakly referenced or hashed: built each time
        return ChatPromptEncoder(tokenizer)
    if encoder is None:
        encoder = _ENCODERS[tokenizer] = ChatPromptEncoder(tokenizer)
    return encoder


def unmark(text: str, markers: Tuple[str, str]) -> str:
    """``text`` without ``markers``."""
    return text.replace(markers[0], "").replace(markers[1], "")


class ChatPromptEncoder:
    """Renders conversations with a tokenizer's chat template and tokenizes them (see the module docstring).

    Build one per tokenizer: the special tokens are read once, when it is built.

    Args:
        tokenizer: A transformers tokenizer with a chat template.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.special_texts = special_token_texts(tokenizer)
        """The special tokens' texts that client text is tokenized as text for."""
        self._special_text: Optional[Pattern[str]] = (
            re.compile("|".join(re.escape(text) for text in sorted(self.special_texts))) if self.special_texts else None
        )

    def encode(
        self,
        messages: List[Dict[str, Any]],
        tools: Optional[List[Dict[str, Any]]] = None,
        *,
        assistant_prefix: str = "",
        template_kwargs: Optional[Dict[str, Any]] = None,
    ) -> List[int]:
        """Render a conversation with the chat template, followed by the generation prompt, and tokenize it.

        Args:
            messages: The conversation (``role`` / ``content`` dicts, tool calls included).
            tools: Tools offered to the model (OpenAI's ``tools`` entries).
            assistant_prefix: Server text appended after the generation prompt, tokenized like the template's.
            template_kwargs: Extra variables for the template.

        Returns:
            The prompt's token ids: those of the rendered text tokenized with special tokens parsed, unless some
            string of ``messages``, ``tools`` or ``template_kwargs`` holds a special token's text, which is then
            tokenized as plain text.

        Raises:
            EngineError: The model has no chat template, the template rejects the conversation, the text holds
                characters that are not valid Unicode (lone surrogates), or the template changes client text that
                holds special-token text, so that it cannot be told apart from the template's own.
        """
        template = getattr(self._tokenizer, "chat_template", None)
        if not template:
            raise EngineError("this model has no chat template; use /v1/completions")
        variables = template_kwargs or {}
        text = self._render(messages, tools, variables) + assistant_prefix
        check_unicode(text, "messages")
        marking = self.mark_client_text([messages, tools, variables], extra_texts=[assistant_prefix])
        if marking is None:
            return self.encode_template_text(text)
        (marked_messages, marked_tools, marked_variables), markers = marking
        marked = self._render(marked_messages, marked_tools, marked_variables) + assistant_prefix
        ids = self.encode_marked(marked, markers)
        # The same text, and tokens that spell it (a tokenizer that prefixes a space at the start of a text would
        # insert one before each client string)
        if ids is None or unmark(marked, markers) != text or not self.spells_the_same(ids, text):
            raise EngineError(
                f"messages hold the text of the special token {self.found_special_text(messages, tools, variables)!r} "
                "where this model's chat template or tokenizer changes text, so it cannot be tokenized as plain "
                "text; remove it"
            )
        return ids

    def found_special_text(self, *values: Any) -> Optional[str]:
        """The first special token's text found in the strings of ``values`` (None when there is none)."""
        pattern = self._special_text
        if pattern is None:
            return None
        found = next(filter(None, map(pattern.search, _strings(list(values)))), None)
        return None if found is None else found.group()

    def mark_client_text(self, value: Any, extra_texts: Sequence[str] = ()) -> Optional[Tuple[Any, Tuple[str, str]]]:
        """``value`` (nested lists and dicts) with each string holding a special token's text put between two
        markers, and the markers: private-use characters found in no string of ``value``, of the chat template
        or of ``extra_texts``. ``None`` when no string holds such text (then nothing needs marking).

        Raises:
            EngineError: Every private-use character is taken.
        """
        pattern = self._special_text
        if pattern is None or self.found_special_text(value) is None:
            return None
        template = str(getattr(self._tokenizer, "chat_template", "") or "")
        opening, closing = _markers([*_strings(value), template, *extra_texts])

        def mark(item: Any) -> Any:
            if isinstance(item, str):
                return f"{opening}{item}{closing}" if pattern.search(item) else item
            if isinstance(item, dict):
                return {mark(key): mark(entry) for key, entry in item.items()}
            if isinstance(item, (list, tuple)):
                return [mark(entry) for entry in item]
            return item

        return mark(value), (opening, closing)

    def encode_marked(self, text: str, markers: Tuple[str, str]) -> Optional[List[int]]:
        """Token ids of rendered ``text`` in which client strings stand between ``markers``: the text outside them
        with special tokens parsed, the text inside as plain text. ``None`` when the markers do not come in pairs
        (the template cut or moved a string)."""
        opening, closing = markers
        template_text, *pieces = text.split(opening)
        if closing in template_text:
            return None
        ids = self.encode_template_text(template_text)
        for piece in pieces:
            client_text, found, template_text = piece.partition(closing)
            if not found or closing in template_text:
                return None
            ids += self.encode_client_text(client_text) + self.encode_template_text(template_text)
        return ids

    def spells_the_same(self, ids: List[int], text: str) -> bool:
        """Whether ``ids`` decode to what ``text`` tokenized in one piece decodes to (a tokenizer that puts a space
        before the start of each text it is given would not)."""
        decode = self._tokenizer.decode
        return bool(decode(ids) == decode(self.encode_template_text(text)))

    def _render(self, messages: List[Dict[str, Any]], tools: Optional[List[Any]], variables: Dict[str, Any]) -> str:
        try:
            text = self._tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False, **variables
            )
        except Exception as exc:  # jinja errors: bad roles, missing fields...
            raise EngineError(f"chat template failed: {exc}") from exc
        return str(text)

    def encode_template_text(self, text: str) -> List[int]:
        """Token ids of template text: special tokens parsed, no BOS/EOS added."""
        return list(self._tokenizer(text, add_special_tokens=False).input_ids)

    def encode_client_text(self, text: str) -> List[int]:
        """Token ids of client text: special tokens' text tokenized as text, no BOS/EOS added."""
        backend = self._text_backend
        if backend is None:
            return list(self._tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids)
        return list(backend.encode(text, add_special_tokens=False).ids)

    @cached_property
    def _text_backend(self) -> Any:
        """A private copy of the ``tokenizers`` backend that tokenizes special tokens as text, or ``None`` for a
        tokenizer without one.

        transformers' ``split_special_tokens=True`` switches a flag on the shared backend for the duration of a call,
        which a concurrent call (the server tokenizes in several threads) would see or undo; the copy has the flag
        set for good. Named special tokens that the backend does not flag as special are flagged in the copy.
        """
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        from tokenizers import AddedToken

        text_backend = copy.deepcopy(backend)
        text_backend.no_truncation()
        text_backend.no_padding()
        unflagged = [
            AddedToken(
                token.content,
                single_word=token.single_word,
                lstrip=token.lstrip,
                rstrip=token.rstrip,
                normalized=token.normalized,
                special=True,
            )
            for token in text_backend.get_added_tokens_decoder().values()
            if token.content in self.special_texts and not token.special
        ]
        if unflagged:
            text_backend.add_special_tokens(unflagged)
        text_backend.encode_special_tokens = True
        return text_backend
