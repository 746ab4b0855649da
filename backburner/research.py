"""``research``: agentic RAG over a local folder of documents, as a durable pipeline.

``install_research(bb, folder="docs/")`` registers the pipeline ``research`` and its two child
tasks. One run: step ``plan`` (the model proposes search queries; the question itself is
always the first), map ``search`` (one child per query: BM25 over the folder's passages),
step ``sources`` (the best documents, numbered), map ``notes`` (one child per source: the
model's notes on it), step ``answer`` (the model answers from the notes, citing ``[n]``).
Small models answer badly, so every model output is checked against the documents and
replaced by an extract of them when it does not hold (docs/pipelines.md).

The folder is the operator's: a request names only documents the index holds, never a path
of its own choosing. BM25 is ``bm25s`` with the Snowball stemmer (``backburner[research]``).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from .errors import InvalidInputError, PermanentError
from .research_index import EXCERPT_CHARS, Analyzer, ResearchLibrary
from .research_index import clip as _clip

if TYPE_CHECKING:
    from .app import Backburner
    from .context import JobContext
    from .pipelines import PipelineContext

RESEARCH = "research"
MAX_SOURCES = 8
MAX_QUESTION_CHARS = 2000
MAX_QUERIES = 4
NOTE_CHARS = 400

_CITATION = re.compile(
    r"\[\s*(?:sources?\s*)?(\d+(?:\s*(?:[,;\u2013-]|and)\s*\d+)*)\s*\]", re.IGNORECASE
)
"""A citation as models write them: ``[1]``, ``[1, 2]``, ``[ 1 ]``, ``[3-5]``, ``[Source 7]``."""
_CITED = re.compile(r"(\d+)(?:\s*[\u2013-]\s*(\d+))?")
MAX_RANGE = 20
"""A range cites at most this many sources (``[1-1000]`` is not a citation of each)."""
_SOURCE_PREFIX = re.compile(
    r"^\s*(?:the\s+)?source\s*\[\d+\]\s*(?:\([^)]*\))?\s*(?:says(?:\s+that)?)?\s*:?\s*",
    re.IGNORECASE,
)
_FILE_MENTION = re.compile(r"\(\s*[\w./-]+\.(?:md|markdown|txt|rst)\s*\)\s*", re.IGNORECASE)
"""``(leases.md)``: small models cite file names, real or made up; the answer cites [n]."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LIST_MARK = re.compile(r"^\s*(?:[-*•]+|\d+[.)]|\(\d+\)|queries?:)\s*", re.IGNORECASE)


# -- the model's outputs, checked ------------------------------------------------------------


def parse_queries(
    text: str, question: str, analyzer: Analyzer, known: Collection[str] | None = None
) -> list[str]:
    """The question, then up to three distinct queries the model proposed, one a line. A line
    is dropped when it is empty or long, repeats another, or (given the folder's terms,
    ``known``) has less than half of its terms in the folder: it would find nothing."""
    queries = [question]
    seen = {" ".join(analyzer.terms(question))}
    for line in text.replace(";", "\n").splitlines():
        line = _LIST_MARK.sub("", line).strip().strip("\"'`").strip()
        terms = analyzer.terms(line)
        key = " ".join(terms)
        if not terms or not 1 <= len(line.split()) <= 16 or key in seen:
            continue
        if known is not None and 2 * sum(t in known for t in terms) < len(terms):
            continue
        seen.add(key)
        queries.append(line)
        if len(queries) == MAX_QUERIES:
            break
    return queries


def grounded(text: str, source: str, analyzer: Analyzer, *, share: float = 0.6) -> bool:
    """True when at least ``share`` of ``text``'s terms (and two or more) are in ``source``."""
    terms = analyzer.term_set(text)
    if len(terms) < 2:
        return False
    return len(terms & analyzer.term_set(source)) >= share * len(terms)


def extract(excerpt: str, question: str, analyzer: Analyzer, limit: int = NOTE_CHARS) -> str:
    """The excerpt's sentences that share most terms with the question (in their order)."""
    wanted = analyzer.term_set(question)
    sentences = [s.strip() for s in _SENTENCE_END.split(" ".join(excerpt.split())) if s.strip()]
    if not sentences:
        return ""
    ranked = sorted(
        range(len(sentences)),
        key=lambda i: (-len(wanted & analyzer.term_set(sentences[i])), i),
    )
    chosen: list[int] = []
    size = 0
    for i in ranked:
        if chosen and size + len(sentences[i]) > limit:
            break
        chosen.append(i)
        size += len(sentences[i]) + 1
        if len(chosen) == 2:
            break
    return _clip(" ".join(sentences[i] for i in sorted(chosen)), limit)


def cite(
    text: str, question: str, sources: list[dict[str, Any]], analyzer: Analyzer
) -> tuple[str, str]:
    """The model's answer with its citations checked: ``(answer, "model")``, or, when it
    cites no listed source and no sentence of it can be traced to one, an answer made of the
    sources' notes, each cited: ``(answer, "extract")``."""
    numbers = {int(s["n"]) for s in sources}

    def keep(match: re.Match[str]) -> str:
        cited: list[int] = []
        for first, last in _CITED.findall(match.group(1)):
            low, high = int(first), int(last or first)
            if high - low < MAX_RANGE:
                cited.extend(range(low, high + 1))
        return "".join(f"[{n}]" for n in dict.fromkeys(cited) if n in numbers)

    answer = _CITATION.sub(keep, _tidy(_FILE_MENTION.sub("", _clean(text)))).strip()
    answer = re.sub(r"[ \t]+([.,;:!?])", r"\1", re.sub(r"[ \t]{2,}", " ", answer))
    if answer and _CITATION.search(answer):
        return answer, "model"
    asked = analyzer.term_set(question)
    support = [(s["n"], analyzer.term_set(f"{s['excerpt']} {s.get('note', '')}")) for s in sources]
    traced = False
    sentences = []
    for sentence in _SENTENCE_END.split(answer):
        new = analyzer.term_set(sentence) - asked  # restating the question proves nothing
        best = max(support, key=lambda s: len(new & s[1]), default=None)
        if best is not None and len(new) >= 2 and len(new & best[1]) >= 0.5 * len(new):
            sentence = _with_citation(sentence, best[0])
            traced = True
        sentences.append(sentence)
    if traced:
        return " ".join(sentences), "model"
    notes = [
        _with_citation(_clip(str(s.get("note") or s["excerpt"]), NOTE_CHARS), s["n"])
        for s in sources
    ]
    return " ".join(notes), "extract"


def _with_citation(sentence: str, n: object) -> str:
    """``sentence`` with `` [n]`` before its final full stop (or at its end)."""
    sentence = sentence.rstrip()
    end = sentence[-1] if sentence and sentence[-1] in ".!?" else ""
    return f"{sentence[: len(sentence) - len(end)].rstrip()} [{n}]{end}"


def _tidy(text: str) -> str:
    """One copy of each sentence (small models repeat themselves), and no unfinished last
    sentence (the model ran out of tokens) unless it is the only one."""
    pieces = re.split(r"(?<=[.!?])(\s+)", text)
    kept: list[str] = []
    seen: dict[str, int] = {}
    for sentence, gap in zip(pieces[0::2], [*pieces[1::2], ""], strict=True):
        key = " ".join(re.sub(r"\W+", " ", _CITATION.sub("", sentence).lower()).split())
        if not key:
            continue
        if key not in seen:
            seen[key] = len(kept)
            kept.append(sentence + gap)
        elif _CITATION.search(sentence) and not _CITATION.search(kept[seen[key]]):
            kept[seen[key]] = sentence + gap  # the copy that cites its source
    if len(kept) > 1 and not re.search(r"[.!?)\]\"'”]\s*$", kept[-1]):
        kept.pop()
    return "".join(kept).strip()


def _clean(text: str) -> str:
    text = re.sub(r"^\s*(?:answer|notes?)\s*:\s*", "", text.strip(), flags=re.IGNORECASE)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# -- prompts ------------------------------------------------------------------------------------

PLAN_PROMPT = """\
The documents: {titles}.
Write two to four short search queries that would find the facts in these documents needed \
to answer the question, one per line.

Question: How do I stop one busy customer from slowing down everyone else?
Search queries:
- fair scheduling between customers
- per-customer quotas and rate limits

Question: {question}
Search queries:
-"""

NOTES_PROMPT = """\
Source [{n}] ({path}):
{excerpt}

Question: {question}
In one or two sentences, write what source [{n}] says that helps answer the question.
Notes:"""

ANSWER_PROMPT = """\
Answer the question using only the numbered notes below. After each fact, cite its source \
number in brackets, like [1]. If the notes do not answer the question, say so.

{notes}

Question: {question}
Answer:"""

_PLAN_STOPS = ("\n\n", "\nQuestion:")
_NOTES_STOPS = ("\n\n", "\nQuestion:", "\nSource [")
_ANSWER_STOPS = ("\nQuestion:", "Answer:", "\n\n\n")


# -- the pipeline -------------------------------------------------------------------------------


def pick_sources(found: list[list[dict[str, Any]]], max_sources: int) -> list[dict[str, Any]]:
    """Fuse the searches. The first is the question's own and weighs as much as all the
    model's queries together (a small model's queries often miss the point). Within one
    query's hits a document scores the sum of its two best passages' scores divided by the
    query's best score; its total is the weighted sum over queries.
    The top ``max_sources`` documents (and none below a quarter of the best one's total),
    numbered from 1, each with its two best passages as the excerpt."""
    doc_score: dict[str, float] = {}
    passage_score: dict[tuple[str, int], float] = {}
    texts: dict[tuple[str, int], str] = {}
    for index, hits in enumerate(found):
        if not hits:
            continue
        weight = 1.0 if index == 0 else 1.0 / (len(found) - 1)
        top = max(float(h["score"]) for h in hits) or 1.0
        mine: dict[str, list[float]] = {}
        for hit in hits:
            key = (str(hit["path"]), int(hit["passage"]))
            value = weight * float(hit["score"]) / top
            texts[key] = str(hit["text"])
            passage_score[key] = passage_score.get(key, 0.0) + value
            mine.setdefault(key[0], []).append(value)
        for path, values in mine.items():
            doc_score[path] = doc_score.get(path, 0.0) + sum(sorted(values)[-2:])
    floor = 0.25 * max(doc_score.values(), default=0.0)
    doc_score = {path: value for path, value in doc_score.items() if value >= floor}
    ranked = sorted(doc_score, key=lambda p: (-doc_score[p], p))[:max_sources]
    sources = []
    for n, path in enumerate(ranked, 1):
        best = sorted(
            (k for k in passage_score if k[0] == path), key=lambda k: (-passage_score[k], k[1])
        )[:2]
        numbers = sorted(k[1] for k in best)
        excerpt = _clip("\n\n".join(texts[(path, i)] for i in numbers), EXCERPT_CHARS)
        sources.append(
            {
                "n": n,
                "path": path,
                "passages": numbers,
                "score": round(doc_score[path], 4),
                "excerpt": excerpt,
            }
        )
    return sources


def _pick(source: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: source[key] for key in keys}


def _check_input(question: object, max_sources: object, model: object) -> str:
    if not isinstance(question, str) or not question.strip():
        raise PermanentError("question must be a non-empty string")
    if len(question) > MAX_QUESTION_CHARS:
        raise PermanentError(f"question must be at most {MAX_QUESTION_CHARS} characters")
    if isinstance(max_sources, bool) or not isinstance(max_sources, int):
        raise PermanentError(f"max_sources must be an integer 1..{MAX_SOURCES}")
    if not 1 <= max_sources <= MAX_SOURCES:
        raise PermanentError(f"max_sources must be within 1..{MAX_SOURCES}, got {max_sources}")
    if model is not None and (not isinstance(model, str) or not model):
        raise PermanentError("model must be a model name (a string) or null")
    return " ".join(question.split())


def install_research(
    bb: Backburner,
    *,
    folder: str | os.PathLike[str],
    name: str = RESEARCH,
    model: str | None = None,
) -> ResearchLibrary:
    """Register the pipeline ``name`` (default ``research``) over the documents of ``folder``
    (``.md``, ``.markdown``, ``.txt``, ``.rst``), and its child tasks ``{name}.search`` and
    ``{name}.notes``. ``model``: what a request naming none uses (default: the ``local``
    model when it is installed and no default model was configured, else the default).

    Returns the folder's library (its index is built at the first job, or by ``ready()``).
    Raises ConfigurationError for a missing folder, MissingDependencyError without the extra.
    """
    library = ResearchLibrary(folder)
    search_task = f"{name}.search"
    notes_task = f"{name}.notes"

    def default_model() -> str | None:
        if model is not None:
            return model
        if not bb.models.default_is_set and "local" in bb.models.routes:
            return "local"
        return None  # the configured default

    @bb.task(name=search_task, max_attempts=3, timeout=120)
    async def search(ctx: JobContext, query: str, k: int = 8) -> list[dict[str, Any]]:
        """The folder's passages that match ``query`` best (BM25)."""
        if not isinstance(query, str) or isinstance(k, bool) or not isinstance(k, int):
            raise PermanentError("query must be a string and k an integer")
        await library.ready()
        return await asyncio.to_thread(library.search, query, max(1, min(k, 50)))

    @bb.task(name=notes_task, max_attempts=3, timeout=600)
    async def notes(
        ctx: JobContext,
        question: str,
        path: str,
        passages: list[int],
        n: int = 1,
        model: str | None = None,
    ) -> dict[str, Any]:
        """The model's notes on the passages of one document: what they say about the
        question (an extract of them when the model's notes are not drawn from them)."""
        question = _check_input(question, 1, model)
        await library.ready()
        excerpt = library.document(path).excerpt(passages if isinstance(passages, list) else [])
        prompt = NOTES_PROMPT.format(n=n, path=path, excerpt=excerpt, question=question)
        reply = await ctx.llm.generate(prompt, model=model, max_tokens=120, stop=_NOTES_STOPS)
        note = _clip(" ".join(_SOURCE_PREFIX.sub("", _clean(reply.text)).split()), NOTE_CHARS)
        by = "model"
        if not grounded(note, excerpt, library.analyzer):
            note, by = extract(excerpt, question, library.analyzer), "extract"
        return {"n": n, "path": path, "note": note, "note_by": by, "model": reply.model}

    async def plan(ctx: Any, question: str, chosen: str | None) -> dict[str, Any]:
        await library.ready()
        titles = "; ".join(d.title for d in list(library.documents.values())[:20])
        prompt = PLAN_PROMPT.format(question=question, titles=titles)
        reply = await ctx.llm.generate(prompt, model=chosen, max_tokens=64, stop=_PLAN_STOPS)
        queries = parse_queries("-" + reply.text, question, library.analyzer, library.vocabulary)
        return {"queries": queries, "model": chosen, "proposed": reply.text.strip()}

    async def answer(
        ctx: Any,
        question: str,
        chosen: str | None,
        queries: list[str],
        sources: list[dict[str, Any]],
        written: list[dict[str, Any] | None],
    ) -> dict[str, Any]:
        await library.ready()
        listed = []
        for source, note in zip(sources, written, strict=True):
            item = _pick(source, "n", "path", "excerpt")
            if note is None:  # its child failed for good: the passages speak for themselves
                item["note"] = extract(source["excerpt"], question, library.analyzer)
                item["note_by"] = "extract"
            else:
                item["note"], item["note_by"] = note["note"], note["note_by"]
            listed.append(item)
        result: dict[str, Any] = {"question": question, "queries": queries, "sources": listed}
        if not listed:
            result.update(answer="The documents say nothing about this question.")
            result.update(answer_by="none", model=None)
            return result
        lines = "\n".join(f"[{s['n']}] ({s['path']}) {s['note']}" for s in listed)
        prompt = ANSWER_PROMPT.format(notes=lines, question=question)
        reply = await ctx.llm.generate(prompt, model=chosen, max_tokens=300, stop=_ANSWER_STOPS)
        text, by = cite(reply.text, question, listed, library.analyzer)
        result.update(answer=text, answer_by=by, model=reply.model)
        return result

    async def research(
        ctx: PipelineContext, question: str, max_sources: int = 4, model: str | None = None
    ) -> dict[str, Any]:
        """Answer ``question`` from the folder's documents, citing them ``[n]``."""
        question = _check_input(question, max_sources, model)
        priority = ctx.job.priority  # the children run at the request's priority
        planned = await ctx.step("plan", plan, ctx, question, model or default_model())
        chosen = planned["model"]
        k = max(4, 2 * max_sources)
        found = await ctx.map(
            "search",
            search_task,
            [{"query": q, "k": k} for q in planned["queries"]],
            priority=priority,
        )
        sources = await ctx.step("sources", pick_sources, found, max_sources)
        written = await ctx.map(
            "notes",
            notes_task,
            [
                {"question": question, "model": chosen, **_pick(s, "path", "passages", "n")}
                for s in sources
            ],
            metadata=[{"source": s["n"], "path": s["path"]} for s in sources],
            priority=priority,
            partial=True,  # a source whose notes failed is cited from its passages instead
        )
        result: dict[str, Any] = await ctx.step(
            "answer", answer, ctx, question, chosen, planned["queries"], sources, written
        )
        return result

    def validate(payload: dict[str, Any]) -> None:
        """At submission: a bad question, option or model is a 422, nothing stored (it was
        stored, then failed, and kept in the dead-letter queue for 7 days)."""
        model = payload.get("model")
        try:
            _check_input(payload.get("question"), payload.get("max_sources", 4), model)
        except PermanentError as exc:
            raise InvalidInputError(str(exc)) from None
        if model is not None and model not in bb.models.routes:
            known = ", ".join(sorted(bb.models.routes))
            raise InvalidInputError(f"no model {model!r} is configured (known: {known})")

    bb.pipeline(name=name, max_attempts=3, timeout=900, validate=validate)(research)
    return library
