"""The ``research`` example pipeline: BM25 over a folder, the plan/search/notes/answer run on
the simulated model (deterministic), citations that name listed sources, no path traversal."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backburner import Backburner
from backburner.errors import InvalidInputError, MissingDependencyError
from backburner.models import JobStatus
from backburner.providers import ModelRouter
from backburner.providers.local import local_available
from backburner.research import cite, grounded, install_research, parse_queries
from backburner.research_index import PASSAGE_CHARS, Analyzer, ResearchLibrary, split_passages

from ..conftest import BACKENDS, drop_redis_keys, make_backend
from ..helpers import ROOT, WORKER_TEST_SETTINGS, running_worker
from ..live_server import live_server

DOCS = ROOT / "examples" / "research" / "docs"
FAST = {
    "default_model": "fast",
    "models": {
        "fast": {
            "provider": "simulated",
            "options": {"time_to_first_token_s": 0, "tokens_per_s": 100_000},
        }
    },
}


@pytest.fixture(scope="module")
def library() -> ResearchLibrary:
    return ResearchLibrary(DOCS)


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    return Analyzer()


@pytest.fixture(params=BACKENDS)
async def bb(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backburner]:
    engine = make_backend(str(request.param), tmp_path)
    settings = WORKER_TEST_SETTINGS.replace(pipeline_poll_s=0.5)
    app = Backburner(engine, settings=settings, models=ModelRouter(FAST))
    install_research(app, folder=DOCS)
    try:
        yield app
    finally:
        await app.close()
        await drop_redis_keys(engine)


def _cited(answer: str) -> set[int]:
    return {int(n) for group in re.findall(r"\[([\d, ]+)\]", answer) for n in group.split(",")}


def require_local() -> None:
    if local_available():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but backburner[local] is not installed")
    pytest.skip("backburner[local] is not installed")


# -- retrieval ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What happens to a job when its worker crashes and the lease runs out?", "leases.md"),
        ("How long should a client wait before it retries after a 429?", "retries.md"),
        ("Where do poison messages go, and how are they replayed?", "dead-letter-queues.md"),
        ("How does an idempotency key stop a duplicate job?", "idempotency.md"),
        ("When did Amazon SQS become generally available?", "history.md"),
        ("How do cron schedules cope with daylight saving time?", "scheduling.md"),
        ("What is a saga and how does compensation work?", "workflows.md"),
        ("Should I alert on queue depth or on the age of the oldest job?", "observability.md"),
        ("How does weighted fair queueing keep one tenant from starving others?", "priorities.md"),
    ],
)
def test_bm25_ranks_the_obviously_relevant_document_first(
    library: ResearchLibrary, question: str, expected: str
) -> None:
    hits = library.search(question, k=5)
    assert hits and hits[0]["path"] == expected, [h["path"] for h in hits]
    assert hits == sorted(hits, key=lambda h: -h["score"]) and all(h["score"] > 0 for h in hits)
    assert hits[0]["text"] in (DOCS / expected).read_text().replace("\n", " ") or hits[0]["text"]


def test_every_document_is_indexed_in_passages(library: ResearchLibrary) -> None:
    files = sorted(p.name for p in DOCS.glob("*.md"))
    assert sorted(library.documents) == files and 6 <= len(files) <= 10
    leases = library.document("leases.md")
    assert leases.title == "Leases, heartbeats and visibility timeouts"
    assert {p.section for p in leases.passages} >= {"The lease", "Heartbeats", "Fencing tokens"}
    assert all(len(p.text) < 1200 for p in leases.passages)


def test_a_question_the_folder_cannot_answer_finds_nothing(library: ResearchLibrary) -> None:
    assert library.search("zyxxy quorple") == []
    assert library.search("the of and") == []  # stop words only


def test_headings_start_passages_and_paragraphs_are_packed() -> None:
    doc = split_passages("a/b.md", "# Title\n\nOne.\n\nTwo.\n\n## Part\n\nThree.\n")
    assert doc.title == "Title"
    assert [(p.section, p.text) for p in doc.passages] == [
        ("Title", "One.\n\nTwo."),
        ("Part", "Three."),
    ]
    assert split_passages("notes_on-things.txt", "plain text").title == "notes on things"


def test_a_paragraph_longer_than_a_passage_is_cut_into_passages() -> None:
    # A log of 1.9 MB without a blank line was one passage: each search stored 19 MB.
    words = " ".join(f"word{i}" for i in range(2000))
    doc = split_passages("log.txt", f"Intro.\r\r{words}\r\r{'x' * 1500}")  # (CR line ends)
    assert doc.passages[0].text == "Intro."
    assert all(len(p.text) <= PASSAGE_CHARS for p in doc.passages)
    texts = [p.text for p in doc.passages[1:]]
    assert " ".join(t for t in texts if t.startswith("word")) == words
    assert "".join(t for t in texts if t.startswith("x")) == "x" * 1500  # no space: cut hard
    assert [p.number for p in doc.passages] == list(range(len(doc.passages)))


# -- no path traversal ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "../secret.md",
        "/etc/passwd",
        "docs/../../secret.md",
        "..\\secret.md",
        "missing.md",
        "",
        "leases.md\x00.txt",
        None,
        3,
    ],
)
def test_paths_outside_the_folder_or_not_indexed_are_refused(
    library: ResearchLibrary, path: Any
) -> None:
    from backburner.errors import PermanentError

    with pytest.raises(PermanentError, match="refused"):
        library.document(path)


def test_links_out_of_the_folder_and_other_files_are_not_indexed(tmp_path: Path) -> None:
    outside = tmp_path / "secret.md"
    outside.write_text("# Secret\n\nThe launch code is swordfish.\n")
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "inside.md").write_text("# Inside\n\nQueues hold jobs.\n")
    (folder / "link.md").symlink_to(outside)
    (folder / ".hidden.md").write_text("swordfish")
    (folder / "image.png").write_bytes(b"swordfish")
    # A link inside the folder to a hidden file (.env, .git/config) is as hidden: git keeps
    # links, so whoever commits to a docs repo could have served the checkout's token.
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("url = https://token:swordfish@example.com/x")
    (folder / "faq.md").symlink_to(folder / ".git" / "config")
    (folder / "setup.txt").symlink_to(folder / ".hidden.md")
    # Names a job could not hold or a notes child could not read: every question that
    # matched one failed (a search result with a lone surrogate cannot be stored).
    (folder / os.fsdecode(b"caf\xe9 swordfish.md")).write_text("Queues hold swordfish.\n")
    (folder / "lease\\notes.md").write_text("Queues hold swordfish.\n")
    library = ResearchLibrary(folder)
    assert list(library.documents) == ["sub/inside.md"]
    assert library.search("swordfish launch code") == []
    assert library.document("sub/inside.md").passages[0].text == "Queues hold jobs."


async def test_a_notes_job_naming_a_path_outside_the_folder_fails_at_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "secret.md").write_text("# Secret\n\nswordfish\n")
    folder = tmp_path / "docs"
    shutil.copytree(DOCS, folder)
    bb = Backburner("memory://", settings=WORKER_TEST_SETTINGS, models=ModelRouter(FAST))
    install_research(bb, folder=folder)
    async with bb, running_worker(bb, concurrency=2):
        job = await bb.enqueue(
            "research.notes",
            {"question": "what is the code?", "path": "../secret.md", "passages": [0]},
        )
        done = await bb.wait(job.task_id, timeout=30)
        events = await bb.events(job.task_id)
    assert done.status == JobStatus.FAILED and done.attempts == 1
    assert done.error is not None and "outside the research folder" in done.error.message
    assert not any(e.type == "token" for e in events)  # the model was never called


def test_a_missing_folder_or_library_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backburner.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="not a directory"):
        install_research(Backburner("memory://"), folder=tmp_path / "nope")
    real = __import__("importlib").import_module

    def without_bm25s(name: str, *args: Any) -> Any:
        if name == "bm25s":
            raise ImportError("No module named 'bm25s'")
        return real(name, *args)

    monkeypatch.setattr("backburner.research_index.importlib.import_module", without_bm25s)
    with pytest.raises(MissingDependencyError, match=re.escape("backburner[research]")):
        install_research(Backburner("memory://"), folder=DOCS)


# -- checking what a small model writes -----------------------------------------------------


def test_queries_are_parsed_robustly_and_the_question_always_comes_first(
    analyzer: Analyzer, library: ResearchLibrary
) -> None:
    q = "How do leases work?"
    messy = (
        "- lease expiry\n2. heartbeat renewal\n* Lease expiry\n\n"
        '"fencing tokens"\n' + "word " * 40 + "\n- ?!\n- visibility timeout\n- more"
    )
    assert parse_queries(messy, q, analyzer) == [
        q,
        "lease expiry",
        "heartbeat renewal",
        "fencing tokens",
    ]
    assert parse_queries("", q, analyzer) == [q]
    assert parse_queries("- How do leases work?", q, analyzer) == [q]  # the question again
    # Gemma 3 270M, asked about crashed workers, proposed car accidents: not in the folder.
    proposed = "- car accident\n- employee is injured\n- lease expiry"
    assert parse_queries(proposed, q, analyzer, library.vocabulary) == [q, "lease expiry"]


def test_citations_are_kept_only_when_they_name_a_listed_source(analyzer: Analyzer) -> None:
    sources = [
        {
            "n": 1,
            "path": "leases.md",
            "excerpt": "A lease expires; the job is claimed again.",
            "note": "An expired lease puts the job back on the queue.",
        },
        {
            "n": 2,
            "path": "retries.md",
            "excerpt": "Backoff grows exponentially with jitter.",
            "note": "Retries wait longer each time, randomised.",
        },
    ]
    q = "What happens when a worker crashes?"
    text, by = cite(
        "Answer: The job returns [1, 7]. It retries later [2][9] [12].", q, sources, analyzer
    )
    assert (text, by) == ("The job returns [1]. It retries later [2].", "model")
    # Other forms models write: a range, a word, spaces. Unlisted sources in them went through.
    text, by = cite(
        "It returns [1-3]. Workers crash [3-5]. See [Source 7] and [ 6 ]. Both [ source 2 ].",
        q,
        sources,
        analyzer,
    )
    assert (text, by) == ("It returns [1][2]. Workers crash. See and. Both [2].", "model")
    traced, by = cite("An expired lease puts the job back on the queue.", q, sources, analyzer)
    assert by == "model" and traced == "An expired lease puts the job back on the queue [1]."
    made, by = cite("The worker crashes.", q, sources, analyzer)  # only restates the question
    assert by == "extract" and made == (
        "An expired lease puts the job back on the queue [1]. "
        "Retries wait longer each time, randomised [2]."
    )


def test_repeats_unfinished_sentences_and_file_names_are_tidied(analyzer: Analyzer) -> None:
    sources = [{"n": 1, "path": "leases.md", "excerpt": "A lease ends.", "note": "It ends."}]
    text = (
        "A worker may crash [1]. (crawling.md) A worker may crash [1]. The lease ends [1]. "
        "The lease ends. Then the queue"
    )
    assert cite(text, "q?", sources, analyzer) == (
        "A worker may crash [1]. The lease ends [1].",
        "model",
    )


def test_a_note_counts_only_when_it_is_drawn_from_its_source(analyzer: Analyzer) -> None:
    source = "When the lease runs out first, the queue makes the job available again."
    assert grounded("The job becomes available again when its lease runs out.", source, analyzer)
    assert not grounded("the answer depends on the question and the context", source, analyzer)
    assert not grounded("lease", source, analyzer)  # one word proves nothing


# -- the pipeline ---------------------------------------------------------------------------


async def test_the_pipeline_answers_with_citations_of_real_documents(bb: Backburner) -> None:
    question = "What happens to a job when its worker crashes and the lease runs out?"
    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("research", {"question": question, "max_sources": 3})
        done = await bb.wait(job.task_id, timeout=60)
        again = await bb.wait(
            (await bb.enqueue("research", {"question": question, "max_sources": 3})).task_id,
            timeout=60,
        )
        events = await bb.events(job.task_id)
        children = (await bb.list(parent_id=job.task_id, limit=100)).jobs
    assert done.status == JobStatus.COMPLETED, done.error
    result = done.result
    assert result is not None and result == again.result  # the simulator is deterministic
    assert set(result) >= {"answer", "sources", "queries", "model", "answer_by"}
    assert result["queries"][0] == question and 1 <= len(result["queries"]) <= 4
    assert result["model"] == "fast"
    sources = result["sources"]
    assert [s["n"] for s in sources] == list(range(1, len(sources) + 1))
    assert 1 <= len(sources) <= 3 and sources[0]["path"] == "leases.md"
    for source in sources:
        assert (DOCS / source["path"]).is_file()
        assert source["excerpt"] and source["note"]
        flat = " ".join((DOCS / source["path"]).read_text().split())
        assert source["excerpt"].split("\n\n")[0].rstrip(" …") in flat
    cited = _cited(result["answer"])
    assert cited and cited <= {s["n"] for s in sources}
    # The simulator writes filler, which cites nothing and is drawn from no source: the
    # answer and the notes are extracts of the documents instead.
    assert result["answer_by"] == "extract"
    assert {s["note_by"] for s in sources} == {"extract"}

    steps = [e.data["name"] for e in events if e.type == "step"]
    assert steps == ["plan", "search", "sources", "notes", "answer"]
    spawned = [e.data["name"] for e in events if e.type == "spawned"]
    assert spawned == ["search", "notes"]
    assert sorted(c.type for c in children) == sorted(
        ["research.search"] * len(result["queries"]) + ["research.notes"] * len(sources)
    )
    assert {c.parent_id for c in children} == {job.task_id}
    assert {c.status for c in children} == {JobStatus.COMPLETED}
    notes = sorted(
        (c for c in children if c.type == "research.notes"), key=lambda c: c.metadata["source"]
    )
    assert [c.metadata["path"] for c in notes] == [s["path"] for s in sources]
    assert any(e.type == "token" for e in events)  # the plan and answer streamed live


async def test_a_question_about_nothing_in_the_folder_says_so(bb: Backburner) -> None:
    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("research", {"question": "zyxxy quorple?"})
        done = await bb.wait(job.task_id, timeout=60)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result is not None and done.result["sources"] == []
    assert "nothing" in done.result["answer"]


@pytest.mark.parametrize("bb", ["memory"], indirect=True)
async def test_bad_input_is_refused_at_submission_with_nothing_stored(bb: Backburner) -> None:
    # It was stored (202), failed at its first run and kept in the dead-letter queue.
    async with bb:
        bad = [
            {"question": ""},
            {"question": "   "},
            {"question": 5},
            {"question": "why?", "max_sources": 0},
            {"question": "why?", "max_sources": 99},
            {"question": "why?", "max_sources": "4"},
            {"question": "why?", "max_sources": True},
            {"question": "why?", "model": 5},
            {"question": "why?", "model": "no-such-model"},
            {"question": "x" * 5000},
        ]
        for payload in bad:
            with pytest.raises(InvalidInputError):
                await bb.enqueue("research", payload)
        assert (await bb.list(limit=10)).jobs == []
        fine = await bb.enqueue("research", {"question": "why?", "max_sources": 2})
        assert fine.status == JobStatus.QUEUED


async def test_the_installed_model_serves_requests_that_name_none() -> None:
    routes = {"models": FAST["models"]}  # no default_model: install_research's choice wins
    bb = Backburner("memory://", settings=WORKER_TEST_SETTINGS, models=ModelRouter(routes))
    install_research(bb, folder=DOCS, model="fast")
    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("research", {"question": "What is a fencing token?"})
        done = await bb.wait(job.task_id, timeout=60)
    assert done.status == JobStatus.COMPLETED, done.error
    assert done.result is not None and done.result["model"] == "fast"
    assert done.result["sources"][0]["path"] == "leases.md"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_on_the_local_model_by_default(tmp_path: Path) -> None:
    """Gemma 3 270M through llama.cpp, when ``backburner[local]`` is installed."""
    require_local()
    bb = Backburner(
        f"sqlite:///{tmp_path / 'jobs.db'}",
        settings=WORKER_TEST_SETTINGS.replace(pipeline_poll_s=0.5),
        models=ModelRouter(),  # no default model configured: research picks `local`
    )
    install_research(bb, folder=DOCS)
    question = "What happens to a job when its worker crashes?"
    async with bb, running_worker(bb, concurrency=4):
        job = await bb.enqueue("research", {"question": question, "max_sources": 3})
        done = await bb.wait(job.task_id, timeout=240)
        children = (await bb.list(parent_id=job.task_id, limit=100)).jobs
    assert done.status == JobStatus.COMPLETED, done.error
    result = done.result
    assert result is not None and result["model"] == "local"
    assert "leases.md" in [s["path"] for s in result["sources"]]  # the model's queries vary
    assert result["answer"].strip()
    assert _cited(result["answer"]) <= {s["n"] for s in result["sources"]}
    notes = [c for c in children if c.type == "research.notes"]
    assert notes and all(c.usage is not None and c.usage.output_tokens > 0 for c in notes)


# -- the example, as its README runs it -----------------------------------------------------


def test_the_example_app_and_client_work_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.research import app, ask

    assert {"research", "research.search", "research.notes"} <= set(app.bb.tasks)
    settings = WORKER_TEST_SETTINGS.replace(
        backend_url=f"sqlite:///{tmp_path / 'api.db'}", pipeline_poll_s=0.5
    )
    bb = Backburner(settings=settings, models=ModelRouter(FAST))
    install_research(bb, folder=app.DOCS)
    with live_server(tmp_path, backburner=bb, pipeline_poll_s=0.5) as server:
        code = ask.main("How does an idempotency key stop a duplicate job?", server.url)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "queries:\n  - How does an idempotency key stop a duplicate job?" in out
    assert "sources:\n  [1] idempotency.md" in out
    assert "step notes done" in out and "step answer done" in out
    assert "answer (extract, model fast):" in out and "[1] idempotency.md: " in out


def test_the_research_folder_setting_makes_research_built_in(tmp_path: Path) -> None:
    from backburner import Backburner, Settings
    from backburner.builtin import install_builtin_tasks

    bb = Backburner("memory://", settings=Settings(research_folder=str(DOCS)))
    install_builtin_tasks(bb)
    assert {"research", "research.search", "research.notes"} <= set(bb.tasks)
    plain = Backburner("memory://", settings=Settings())
    install_builtin_tasks(plain)
    assert "research" not in plain.tasks
