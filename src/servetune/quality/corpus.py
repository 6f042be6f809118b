"""The text `quality` scores, shipped with the package (data/quality/corpus.yaml: public
domain literature and sentences written for servetune, each with its source)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from servetune.errors import InputError
from servetune.yamlfile import load_yaml


@dataclass(frozen=True)
class Passage:
    id: str
    source: str
    text: str


@dataclass(frozen=True)
class Task:
    """A prompt whose greedy continuation's first word must equal `answer`."""

    id: str
    prompt: str
    answer: str


@dataclass(frozen=True)
class Corpus:
    passages: tuple[Passage, ...]
    tasks: tuple[Task, ...]

    def limit(self, passages: int | None, tasks: int | None) -> Corpus:
        """The first `passages` passages and `tasks` tasks (a quicker, noisier check)."""
        return Corpus(self.passages[:passages], self.tasks[:tasks])


def builtin_path() -> Path:
    return Path(str(resources.files("servetune") / "data" / "quality" / "corpus.yaml"))


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The built-in corpus, or a user's file of the same shape (`--corpus`)."""
    p = Path(path) if path else builtin_path()
    data = load_yaml(p, "--corpus")
    fix = f"see {builtin_path().name} in the package for the shape"
    if not isinstance(data, dict):  # an empty file, a list, a word
        raise InputError("--corpus", f"{p} holds no mapping of passages and tasks", fix)
    stray = sorted(str(k) for k in data if k not in ("passages", "tasks"))
    if stray:  # `foo: 1` read as a corpus of no passages
        raise InputError(
            "--corpus", f"{p}: unknown key {stray[0]!r}", "give passages: and tasks: only"
        )
    try:
        passages = tuple(
            Passage(str(d["id"]), str(d.get("source", "")), _text(p, "passage", d, "text"))
            for d in data.get("passages") or []
        )
        tasks = tuple(
            Task(str(d["id"]), _text(p, "task", d, "prompt"), _text(p, "task", d, "answer"))
            for d in data.get("tasks") or []
        )
    except (KeyError, TypeError, AttributeError) as exc:
        what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else "an entry is no mapping"
        raise InputError(
            "--corpus",
            f"{p}: every passage needs id and text, every task id, prompt and answer ({what})",
            fix,
        ) from None
    empty = next((d.id for d in passages if not d.text.strip()), None)
    if empty is not None:
        raise InputError("--corpus", f"{p}: passage {empty!r} has no text", "give it text")
    if len(passages) < 2:
        raise InputError("--corpus", f"{p} has {len(passages)} passage(s)", "give 2 or more")
    return Corpus(passages, tasks)


def _text(path: Path, kind: str, item: dict[str, Any], key: str) -> str:
    """`item[key]` as the text the file holds. YAML types unquoted values: an empty one is
    null, `010` the number 8, `3.10` the float 3.1, `yes` true; str() of those would score
    or compare the word 'None' or '8' instead of what was written."""
    value = item[key]
    if value is None:
        raise InputError(
            "--corpus", f"{path}: {kind} {item['id']!r} has no {key}", f'give it one: {key}: "..."'
        )
    if not isinstance(value, str):
        raise InputError(
            "--corpus",
            f"{path}: {kind} {item['id']!r}: YAML read its {key} as the "
            f"{type(value).__name__} {value!r}, not text",
            f'quote the value as written: {key}: "..."',
        )
    return value
