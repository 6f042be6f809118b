"""Tokenizers used to make prompts of an exact token count and to count output tokens.

Prompt lengths drift from their targets when text is round-tripped through a
tokenizer (vLLM #24591, #10847); `materialize` therefore re-encodes every prompt with
the target's own tokenizer and fixes the tail until the count is exact.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Protocol, runtime_checkable

from servetune.errors import InputError


@runtime_checkable
class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def vocab_size(self) -> int: ...


class WordTokenizer:
    """One token per whitespace-separated word, over common English words (`_WORDS`).

    Used with the mock server (which counts tokens the same way) and when no real
    tokenizer is given: exact for the mock, and close for real engines because most
    tokenizers hold each of these words, space-led, as one token (64 of them are 64 Gemma
    3 tokens on llama.cpp's /tokenize). Its vocabulary was synthetic words ("w3484"),
    which Gemma 3 split into ~4.7 tokens each: `bench --input-len 64` without
    `--tokenizer` sent prompts of ~300 tokens to a llama.cpp server.
    """

    name = "word"

    def __init__(self) -> None:
        self._words = list(_WORDS)
        self._ids = {w: i for i, w in enumerate(self._words)}

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        return [ids.get(w, hash(w) % len(self._words)) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        words = self._words
        return "".join(" " + words[i % len(words)] for i in ids)

    def vocab_size(self) -> int:
        return len(self._words)


class HFTokenizer:
    """A local `tokenizer.json` (or a directory holding one), through the `tokenizers` package.
    Special tokens are not added: the server adds its own BOS/template."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError as exc:  # pragma: no cover - dependency is declared
            raise InputError(
                "--tokenizer", "needs the `tokenizers` package", "pip install tokenizers"
            ) from exc
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise InputError(
                "--tokenizer", f"no tokenizer.json at {path}", "give a file or HF model dir"
            )
        try:
            self._tok = _Tok.from_file(str(p))
        except Exception as exc:  # the Rust side raises a bare Exception: not JSON, not UTF-8
            raise InputError(
                "--tokenizer",
                f"{p} is not a tokenizer.json the `tokenizers` package reads ({exc})",
                "give the tokenizer.json of a Hugging Face model, or its folder",
            ) from None
        self.name = f"hf:{p}"

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()


class ServerTokenizer:
    """The server's own `/tokenize` + `/detokenize` (vLLM and llama.cpp both expose them;
    vLLM takes `prompt`/`tokens`, llama.cpp `content`/`tokens`)."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=30.0, headers=headers)
        self._model = model
        self.name = f"server:{base_url}"

    def _post(self, path: str, body: dict) -> dict:
        if self._model:
            body = {**body, "model": self._model}
        from servetune.http_retry import post_twice

        r = post_twice(self._http, path, body)  # tokenizing is read-only: safe to resend
        r.raise_for_status()
        return r.json()

    def encode(self, text: str) -> list[int]:
        out = self._post(
            "/tokenize", {"prompt": text, "content": text, "add_special_tokens": False}
        )
        return list(out["tokens"])

    def decode(self, ids: list[int]) -> str:
        out = self._post("/detokenize", {"tokens": list(ids)})
        return out.get("prompt", out.get("content", ""))

    def vocab_size(self) -> int:
        return 0  # unknown over HTTP; safe_token_ids uses the word list instead


def load_tokenizer(spec: str | None, base_url: str | None = None) -> Tokenizer:
    """`--tokenizer` value: a path (tokenizer.json / HF dir), `server` (use /tokenize), `word`."""
    if spec is None or spec == "word":
        return WordTokenizer()
    if spec == "server":
        if not base_url:
            raise InputError("--tokenizer", "`server` needs --url", None)
        return ServerTokenizer(base_url)
    return HFTokenizer(spec)


def agree(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether two tokenizers give the same ids for the probe texts (the English words
    prompts are built from, punctuation, digits) and decode them back alike. Why: a server
    that serves a local model directory tokenizes with that directory's tokenizer.json,
    and a local copy that agrees builds prompts with no HTTP call per prompt."""
    try:
        for text in _PROBES:
            ids = a.encode(text)
            if b.encode(text) != ids or a.decode(ids) != b.decode(ids):
                return False
    except Exception:  # noqa: BLE001 - a tokenizer that fails a probe does not agree
        return False
    return True


# Plain English words: most tokenizers hold " word" as one token, which keeps counts exact.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "they",
    "this",
    "be",
    "are",
    "have",
    "not",
    "but",
    "had",
    "which",
    "one",
    "all",
    "were",
    "when",
    "there",
    "can",
    "an",
    "your",
    "their",
    "said",
    "if",
    "do",
    "will",
    "each",
    "about",
    "how",
    "up",
    "out",
    "them",
    "then",
    "she",
    "many",
    "some",
    "so",
    "these",
    "would",
    "other",
    "into",
    "has",
    "more",
    "two",
    "like",
    "him",
    "see",
    "time",
    "could",
    "no",
    "make",
    "than",
    "first",
    "been",
    "its",
    "who",
    "now",
    "people",
    "my",
    "made",
    "over",
    "did",
    "down",
    "only",
    "way",
    "find",
    "use",
    "may",
    "water",
    "long",
    "little",
    "very",
    "after",
    "words",
    "called",
    "just",
    "where",
    "most",
    "know",
    "get",
    "through",
    "back",
    "much",
    "before",
    "go",
    "good",
    "new",
    "write",
    "our",
    "used",
    "me",
    "man",
    "too",
    "any",
    "day",
    "same",
    "right",
    "look",
    "think",
    "also",
    "around",
    "another",
    "came",
    "come",
    "work",
    "three",
    "word",
    "must",
    "because",
    "does",
    "part",
    "even",
    "place",
    "well",
    "such",
    "here",
    "take",
    "why",
    "things",
    "help",
    "put",
    "years",
    "different",
    "away",
    "again",
    "off",
    "went",
    "old",
    "number",
    "great",
    "tell",
    "men",
    "say",
    "small",
    "every",
    "found",
    "still",
    "between",
    "name",
    "should",
    "home",
    "big",
    "give",
    "air",
    "line",
    "set",
    "own",
    "under",
    "read",
    "last",
    "never",
    "us",
    "left",
    "end",
    "along",
    "while",
    "might",
    "next",
    "sound",
    "below",
    "saw",
    "something",
    "thought",
    "both",
    "few",
    "those",
    "always",
    "looked",
    "show",
    "large",
    "often",
    "together",
    "asked",
    "house",
    "world",
    "going",
    "want",
    "school",
    "important",
    "until",
    "form",
    "food",
    "keep",
    "children",
    "feet",
    "land",
    "side",
    "without",
    "boy",
    "once",
    "animals",
    "life",
    "enough",
    "took",
    "sometimes",
    "four",
    "head",
    "above",
    "kind",
    "began",
    "almost",
    "live",
    "page",
    "got",
    "earth",
    "need",
    "far",
    "hand",
    "high",
    "year",
    "mother",
    "light",
    "parts",
    "country",
    "father",
    "let",
    "night",
    "following",
    "picture",
    "being",
    "study",
    "second",
    "eyes",
    "soon",
    "times",
    "story",
    "boys",
    "since",
    "white",
    "days",
    "ever",
    "paper",
    "hard",
    "near",
    "sentence",
    "better",
    "best",
    "across",
    "during",
    "today",
    "others",
    "however",
    "sure",
    "means",
    "knew",
    "try",
    "told",
    "young",
    "miles",
    "sun",
    "ways",
    "thing",
    "whole",
    "hear",
    "example",
    "heard",
    "several",
    "change",
    "answer",
    "room",
    "sea",
    "against",
    "top",
    "turned",
    "learn",
    "point",
    "city",
    "play",
    "toward",
    "five",
    "using",
    "himself",
    "usually",
    "money",
    "seen",
]


# Safe tokens found per tokenizer identity (its name, and the model a server tokenizes for),
# so each measurement against the same server does not search again: id -> its text alone.
_SAFE_BY_NAME: dict[str, dict[int, str]] = {}


def safe_token_ids(tok: Tokenizer, n: int = 2000) -> list[int]:
    """Token ids that round-trip alone and in a row: decode(id) is a space-led word that
    re-encodes to exactly [id]. Prompts built from them keep their token count."""
    return list(safe_token_pieces(tok))[:n]


def safe_token_pieces(tok: Tokenizer) -> dict[int, str]:
    """The safe ids (`safe_token_ids`), each with the text it decodes to alone, so a
    prompt's text is their concatenation and costs no /detokenize call (its count is still
    checked by encoding it). Finding them costs ~1,000 encodes, each an HTTP call for
    `server` (tens of seconds against a loaded engine), so they are kept on the tokenizer
    and by its identity: a new tokenizer object for the same server re-checks three of
    them (a restarted server may tokenize differently) instead of searching again."""
    if isinstance(tok, WordTokenizer):
        return {i: tok.decode([i]) for i in range(tok.vocab_size())}
    found = getattr(tok, "_safe_token_pieces", None)
    key = f"{tok.name}|{getattr(tok, '_model', None) or ''}"
    if found is None and (known := _SAFE_BY_NAME.get(key)) and _still_safe(tok, known):
        found = known
    if found is None:
        found = _find_safe_tokens(tok)
    _SAFE_BY_NAME[key] = found
    # a tokenizer with __slots__ keeps nothing: the identity cache still serves it
    with contextlib.suppress(AttributeError):
        tok._safe_token_pieces = found  # type: ignore[attr-defined]
    return found


def _still_safe(tok: Tokenizer, known: dict[int, str]) -> bool:
    """The first, middle and last id still decode alone to their text and back."""
    ids = list(known)
    sample = dict.fromkeys((ids[0], ids[len(ids) // 2], ids[-1]))
    try:
        return all(
            (text := tok.decode([i])) == known[i] and tok.encode(text) == [i] for i in sample
        )
    except Exception:  # noqa: BLE001 - any failure: search again, which says why
        return False


def _find_safe_tokens(tok: Tokenizer) -> dict[int, str]:
    out: dict[int, str] = {}
    for w in _WORDS:
        ids = tok.encode(" " + w)
        if len(ids) == 1 and ids[0] not in out and tok.decode(ids) == " " + w:
            out[ids[0]] = " " + w
    if len(out) < 64:
        # Small vocabularies (test models): add any id of an English text that round-trips
        # alone; the tail fix-up in `PromptMaker.text` absorbs merges at the joins.
        for i in dict.fromkeys(tok.encode(" ".join(_WORDS))):
            if i not in out and tok.encode(text := tok.decode([i])) == [i]:
                out[i] = text
    if len(out) < 16:
        raise InputError(
            "--tokenizer", f"{tok.name}: too few single-token English words ({len(out)})", None
        )
    return out


# What `agree` compares: the whole word list, then text with what the word list lacks.
_PROBES = (
    " " + " ".join(_WORDS),
    "Hello, world! It's 12:30 on 2026-12-02; 3.14 x 10^5 = 314,159 (approx.)\n\tDone.",
)


def dumps_compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
