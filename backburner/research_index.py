"""The research pipeline's library: a folder's documents split into passages and indexed with
BM25 (``bm25s`` with the Snowball stemmer, ``backburner[research]``), read only through the
index, so a request can name no path of its own choosing."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ConfigurationError, MissingDependencyError, PermanentError

EXTENSIONS = frozenset({".md", ".markdown", ".txt", ".rst"})
MAX_FILE_BYTES = 2 * 1024 * 1024
"""Larger files are not indexed (a document folder, not a data dump)."""
PASSAGE_CHARS = 700
"""Paragraphs are packed into passages of about this many characters."""
EXCERPT_CHARS = 900
INSTALL_HINT = "pip install 'backburner[research]'"

_WORD = re.compile(r"(?u)\b\w\w+\b")
log = logging.getLogger("backburner.research")


def _nameable(relative: str) -> bool:
    """Whether a document of this path can be named in a job (its JSON) and read by it
    (``document`` refuses a backslash): a name that is not UTF-8 decodes with surrogates,
    and a search result holding one could not be stored, failing every question it matched."""
    if "\\" in relative:
        return False
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clip(text: str, limit: int) -> str:
    """``text`` cut at a word to at most about ``limit`` characters."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + " …"


def _dependencies() -> tuple[Any, Any]:
    """The ``bm25s`` and ``Stemmer`` modules, or MissingDependencyError naming the extra."""
    try:
        bm25s = importlib.import_module("bm25s")
        stemmer = importlib.import_module("Stemmer")
    except ImportError:
        raise MissingDependencyError(
            f"the research pipeline needs bm25s and PyStemmer: {INSTALL_HINT}"
        ) from None
    return bm25s, stemmer


class Analyzer:
    """Text → the terms BM25 indexes: lower-case words, no stop words, Snowball stems."""

    def __init__(self) -> None:
        _, stemmer = _dependencies()
        stopwords = importlib.import_module("bm25s.stopwords").STOPWORDS_EN_PLUS
        self._stopwords = frozenset(stopwords)
        self._stem: Callable[[list[str]], list[str]] = stemmer.Stemmer("english").stemWords

    def terms(self, text: str) -> list[str]:
        words = [w for w in _WORD.findall(text.lower()) if w not in self._stopwords]
        return self._stem(words) if words else []

    def term_set(self, text: str) -> frozenset[str]:
        return frozenset(self.terms(text))


@dataclass(frozen=True, slots=True)
class Passage:
    path: str
    """The document's path relative to the folder, with ``/``."""
    number: int
    """Its place in the document (0, 1, ...)."""
    section: str
    text: str


@dataclass(frozen=True, slots=True)
class Document:
    path: str
    title: str
    passages: tuple[Passage, ...]

    def excerpt(self, numbers: Iterable[int]) -> str:
        """The text of these passages, in document order (PermanentError for a bad number)."""
        given = list(numbers)
        if not given or any(
            isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(self.passages)
            for n in given
        ):
            raise PermanentError(f"{self.path} has passages 0..{len(self.passages) - 1}")
        text = "\n\n".join(self.passages[n].text for n in sorted(set(given)))
        return clip(text, EXCERPT_CHARS)


def split_passages(path: str, text: str) -> Document:
    """Paragraphs (blank-line separated) packed into passages; a heading starts a new one."""
    title = PurePosixPath(path).stem.replace("-", " ").replace("_", " ")
    section = ""
    passages: list[Passage] = []
    current: list[str] = []

    def close() -> None:
        if current:
            passages.append(Passage(path, len(passages), section, "\n\n".join(current)))
            current.clear()

    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n")):
        block = block.strip()
        if not block:
            continue
        heading = re.match(r"^#{1,6}\s+(.+)$", block.splitlines()[0])
        if heading:
            close()
            if block.startswith("# ") and not passages:
                title = heading.group(1).strip()
            section = heading.group(1).strip()
            rest = "\n".join(block.splitlines()[1:]).strip()
            if not rest:
                continue
            block = rest
        block = " ".join(block.split())
        if current and sum(len(c) for c in current) + len(block) > PASSAGE_CHARS:
            close()
        if len(block) <= PASSAGE_CHARS:
            current.append(block)
            continue
        # A paragraph longer than a passage (a log, a file without blank lines) is cut into
        # passages of its own: one passage of 1.9 MB made each search's stored result 19 MB.
        for piece in _pieces(block):
            current.append(piece)
            close()
    close()
    return Document(path, title, tuple(passages))


def _pieces(text: str) -> list[str]:
    """``text`` cut into pieces of at most PASSAGE_CHARS characters, at a space if any."""
    pieces: list[str] = []
    while len(text) > PASSAGE_CHARS:
        cut = text.rfind(" ", PASSAGE_CHARS // 2, PASSAGE_CHARS + 1)
        if cut <= 0:
            cut = PASSAGE_CHARS
        pieces.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    if text:
        pieces.append(text)
    return pieces


@dataclass(frozen=True, slots=True)
class _Index:
    analyzer: Analyzer
    documents: dict[str, Document]
    passages: list[Passage]
    """The passages in the index (those with at least one term)."""
    retriever: Any
    """A ``bm25s.BM25`` over the passages (None when the folder has none)."""
    vocabulary: frozenset[str]


class ResearchLibrary:
    """The documents of one folder and their BM25 index, built on first use and then kept for
    the life of the process (restart to see changed files)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        root = Path(folder).expanduser()
        if not root.is_dir():
            raise ConfigurationError(f"the research folder {str(root)!r} is not a directory")
        self.root = root.resolve()
        _dependencies()  # fail at start, not at the first job
        self._lock = threading.Lock()
        self._built: _Index | None = None

    def _files(self) -> list[tuple[str, Path]]:
        found: list[tuple[str, Path]] = []
        for directory, dirs, files in os.walk(self.root):  # does not follow linked folders
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                path = Path(directory) / name
                if name.startswith(".") or path.suffix.lower() not in EXTENSIONS:
                    continue
                relative = path.relative_to(self.root).as_posix()
                if not _nameable(relative):
                    log.warning(
                        "research: %r not indexed: its name is not UTF-8 text without a backslash",
                        relative,
                    )
                    continue
                target = path.resolve()
                if not target.is_relative_to(self.root):  # a link out of the folder
                    continue
                if any(part.startswith(".") for part in target.relative_to(self.root).parts):
                    continue  # a link to a hidden file (.env, .git/config): as hidden
                if not path.is_file():
                    continue  # a broken link, a device
                if path.stat().st_size > MAX_FILE_BYTES:
                    log.warning(
                        "research: %s not indexed: larger than %d bytes", relative, MAX_FILE_BYTES
                    )
                    continue
                found.append((relative, path))
        return found

    def _build(self) -> _Index:
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is not None:
                return self._built
            bm25s, _ = _dependencies()
            analyzer = Analyzer()
            documents: dict[str, Document] = {}
            passages: list[Passage] = []
            corpus: list[list[str]] = []
            for relative, path in self._files():
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue  # unreadable: as if absent
                doc = split_passages(relative, text)
                if not doc.passages:
                    continue
                documents[relative] = doc
                for passage in doc.passages:
                    terms = analyzer.terms(f"{doc.title} {passage.section} {passage.text}")
                    if terms:  # a passage of stop words alone matches nothing
                        passages.append(passage)
                        corpus.append(terms)
            retriever = None
            if passages:
                retriever = bm25s.BM25()
                retriever.index(corpus, show_progress=False)
            self._built = _Index(
                analyzer, documents, passages, retriever, frozenset(t for c in corpus for t in c)
            )
            return self._built

    async def ready(self) -> ResearchLibrary:
        """Build the index (in a thread, once) and return self."""
        if self._built is None:
            await asyncio.to_thread(self._build)
        return self

    @property
    def analyzer(self) -> Analyzer:
        return self._build().analyzer

    @property
    def documents(self) -> dict[str, Document]:
        return self._build().documents

    @property
    def vocabulary(self) -> frozenset[str]:
        """Every term of the folder's documents."""
        return self._build().vocabulary

    def document(self, path: object) -> Document:
        """The indexed document at ``path`` (relative to the folder). Anything else (absolute,
        ``..``, a file not indexed) is refused with PermanentError: requests never choose
        what is read."""
        if not isinstance(path, str) or not path or "\x00" in path or "\\" in path:
            raise PermanentError(f"refused document path {path!r}: not a path in the folder")
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts:
            raise PermanentError(f"refused document path {path!r}: outside the research folder")
        found = self.documents.get(pure.as_posix())
        if found is None:
            raise PermanentError(f"refused document path {path!r}: not a document of the folder")
        return found

    def search(self, query: str, k: int = 8) -> list[dict[str, Any]]:
        """The ``k`` passages that match ``query`` best (BM25; score > 0 only), best first:
        ``{"path", "passage", "score", "text"}``."""
        index = self._build()
        analyzer, passages, retriever = index.analyzer, index.passages, index.retriever
        terms = analyzer.terms(query)
        if retriever is None or not terms:
            return []
        hits, scores = retriever.retrieve(
            [terms], k=min(k, len(passages)), show_progress=False, n_threads=1
        )
        best = [(passages[int(i)], float(v)) for i, v in zip(hits[0], scores[0], strict=True)]
        return [
            {"path": p.path, "passage": p.number, "score": round(v, 4), "text": p.text}
            for p, v in best
            if v > 0
        ]
