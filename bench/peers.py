"""Backburner against its peers on the same Redis (run by hand, not a test).

Setup, once (a bench-only venv outside the repo; the peers are never backburner deps):

    python3.11 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install -e '.[redis]' -r bench/requirements-peers.txt

Run (Redis on 127.0.0.1:6379; only db 8 is used, and FLUSHDB'd before every run):

    /work/bench-venv/bin/python bench/peers.py                       # everything, 3 runs
    /work/bench-venv/bin/python bench/peers.py --quick               # small and fast, 1 run
    /work/bench-venv/bin/python bench/peers.py --only arq,celery --scenarios b,c --runs 5
    /work/bench-venv/bin/python bench/peers.py --backburner-url 'redis://127.0.0.1:6379/8'
    /work/bench-venv/bin/python bench/peers.py --report-only         # re-render peers.md

Scenarios (every worker in its own process; the producer is this process):
  a  enqueue   10,000 no-op enqueues from one producer, per producer mode (an asyncio producer:
               sequential on asyncio's loop and on uvloop's, 64 and 1,000 in flight; 1,000 as
               rq's enqueue_many pipelines)
  b  drain     10,000 queued no-op jobs, one worker process: first start to last completion
  c  pickup    an idle worker; one job at a time, 200 times: job start - enqueue (p50/p99)
  d  sleepers  1,000 and 10,000 jobs that sleep 2 s, one worker process: wall and peak RSS

Each peer is run at the settings shown in the table's "mode" column. Prints a table (median
with min-max over runs) and writes bench/results/peers.json and bench/results/peers.md; a run
of some peers or scenarios replaces only those rows (--quick writes nothing). Worker logs go
to $TMPDIR/backburner-peers-bench/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

try:
    from peers import common
    from peers.common import BenchError, Peer, WorkerProcess, WorkerSpec
except ImportError as exc:  # redis is missing: not the bench venv
    sys.exit(f"{exc}: run this with the bench venv's python (see the docstring of {__file__})")

from report import summarise  # noqa: E402  (bench/report.py)

PEERS = {
    "backburner": "backburner_side",
    "arq": "arq_peer",
    "saq": "saq_peer",
    "taskiq": "taskiq_peer",
    "dramatiq": "dramatiq_peer",
    "rq": "rq_peer",
    "celery": "celery_peer",
}
SCENARIOS = {"a": "enqueue", "b": "drain", "c": "pickup", "d": "sleepers"}
RESULTS = BENCH / "results"


@dataclass(frozen=True)
class Sizes:
    enqueue: int = 10_000
    drain: int = 10_000
    pickup: int = 200
    sleepers: tuple[int, ...] = (1_000, 10_000)


QUICK = Sizes(enqueue=1_000, drain=1_000, pickup=30, sleepers=(200, 1_000))

Metrics = dict[str, float]
Measurement = tuple[str, Callable[[], Metrics]]
"""(mode shown in the table, what measures one run of it)."""


# -- scenarios: each gives the measurements of one run for one peer ----------------------------


def enqueue(peer: Peer, sizes: Sizes) -> list[Measurement]:
    def one(mode: str) -> Metrics:
        return {"jobs_per_s": peer.enqueue(mode, sizes.enqueue)}

    return [(mode, partial(one, mode)) for mode in peer.enqueue_modes]


def run_worker(peer: Peer, spec: WorkerSpec, count: int, deadline_s: float) -> common.Finish:
    worker = WorkerProcess(peer.name, spec)
    try:
        return common.wait_done(worker, count, deadline_s)
    finally:
        worker.stop()


def drain(peer: Peer, sizes: Sizes) -> list[Measurement]:
    count = sizes.drain

    def one(spec: WorkerSpec) -> Metrics:
        peer.fill("noop", count)
        finish = run_worker(peer, spec, count, deadline_s=60 + count / 40)
        return {
            "jobs_per_s": count / finish.elapsed_s,
            "wall_from_spawn_s": finish.from_spawn_s,
            "peak_rss_mb": finish.peak_rss_mb,
            "redis_clients": finish.redis_clients,
        }

    return [(spec.label, partial(one, spec)) for spec in peer.workers("drain", count)]


def pickup(peer: Peer, sizes: Sizes) -> list[Measurement]:
    def one(spec: WorkerSpec) -> Metrics:
        worker = WorkerProcess(peer.name, spec)
        try:
            latencies = sorted(peer.pickup(sizes.pickup))
        except BenchError as exc:
            raise BenchError(f"{exc}; worker log: {worker.log_tail()}") from None
        finally:
            worker.stop()
        return {
            "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)],
        }

    return [(spec.label, partial(one, spec)) for spec in peer.workers("pickup", sizes.pickup)]


def sleepers(peer: Peer, sizes: Sizes) -> list[Measurement]:
    def one(spec: WorkerSpec, count: int) -> Metrics:
        peer.fill("nap", count)
        try:
            finish = run_worker(peer, spec, count, deadline_s=60 + count * 0.012)
        except BenchError as exc:
            raise BenchError(f"{count:,} jobs: {exc}") from None
        return {
            f"wall_s_{count}": finish.elapsed_s,
            f"peak_rss_mb_{count}": finish.peak_rss_mb,
            f"redis_clients_{count}": finish.redis_clients,
        }

    return [
        (spec.label, partial(one, spec, count))
        for count in sizes.sleepers
        for spec in peer.workers("sleepers", count)
    ]


SCENARIO_RUNS: dict[str, Callable[[Peer, Sizes], list[Measurement]]] = {
    "enqueue": enqueue,
    "drain": drain,
    "pickup": pickup,
    "sleepers": sleepers,
}


# -- running -----------------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    peer: str
    mode: str
    samples: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    not_applicable: str = ""


class Bench:
    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self.rows: dict[tuple[str, str, str], Row] = {}

    def row(self, scenario: str, peer: str, mode: str) -> Row:
        key = (scenario, peer, mode)
        return self.rows.setdefault(key, Row(scenario, peer, mode))

    def measure(self, scenario: str, peer: Peer, mode: str, run: Callable[[], Metrics]) -> None:
        row = self.row(scenario, peer.name, mode)
        try:
            common.flush()
            peer.reset()
            metrics = run()
        except Exception as exc:  # one failed run must not stop the benchmark
            message = f"{type(exc).__name__}: {exc}"[:400]
            row.failures.append(message)
            print(f"  {peer.name:10} {scenario:8} {mode:26} FAILED {message}", flush=True)
            return
        finally:
            WorkerProcess.stop_all()
        for key, value in metrics.items():
            row.samples.setdefault(key, []).append(value)
        shown = "  ".join(f"{k}={v:,.1f}" for k, v in metrics.items())
        print(f"  {peer.name:10} {scenario:8} {mode:26} {shown}", flush=True)

    def run_peer(self, peer: Peer, scenarios: list[str]) -> None:
        for scenario in scenarios:
            if scenario in peer.not_applicable:
                self.row(scenario, peer.name, "-").not_applicable = peer.not_applicable[scenario]
                continue
            for mode, run in SCENARIO_RUNS[scenario](peer, self.sizes):
                self.measure(scenario, peer, mode, run)


def load_peer(name: str) -> Peer | str:
    """The peer's adapter, or why it cannot run."""
    try:
        module = importlib.import_module(f"peers.{PEERS[name]}")
        peer: Peer = module.Peer()
    except (ImportError, BenchError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return peer


def versions(peers: dict[str, Peer]) -> dict[str, str]:
    dists = ["redis", "hiredis"] + [d for p in peers.values() for d in p.dists]
    found = {}
    for dist in dists:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def run(
    names: list[str], scenarios: list[str], runs: int, sizes: Sizes
) -> tuple[Bench, dict[str, Peer]]:
    """Run every scenario of every peer ``runs`` times. In a run, each scenario goes through
    the peers one after the other, so that their figures are minutes apart, not the length of
    a run (this machine's speed drifts by a third over tens of minutes); each run starts with
    the next peer, so that none is always first."""
    bench = Bench(sizes)
    peers: dict[str, Peer] = {}
    for name in names:
        loaded = load_peer(name)
        if isinstance(loaded, str):
            print(f"{name}: not run ({loaded})")
            for scenario in scenarios:
                bench.row(scenario, name, "-").not_applicable = f"not run: {loaded}"
        else:
            peers[name] = loaded
    order = list(peers.values())
    for index in range(runs):
        print(f"run {index + 1}/{runs}", flush=True)
        for scenario in scenarios:
            for peer in order:
                bench.run_peer(peer, [scenario])
        order = order[1:] + order[:1]
    return bench, peers


# -- output ------------------------------------------------------------------------------------


def columns(scenario: str, sizes: Sizes) -> list[tuple[str, str, int]]:
    """(header, metric, decimals) of a scenario's table."""
    if scenario == "enqueue":
        return [("jobs/s", "jobs_per_s", 0)]
    if scenario == "drain":
        return [
            ("jobs/s", "jobs_per_s", 0),
            ("peak RSS MB", "peak_rss_mb", 0),
            ("Redis clients", "redis_clients", 0),
        ]
    if scenario == "pickup":
        return [("p50 ms", "p50_ms", 1), ("p99 ms", "p99_ms", 1)]
    cols = []
    for count in sizes.sleepers:
        cols += [
            (f"{count:,}: wall s", f"wall_s_{count}", 2),
            (f"{count:,}: peak RSS MB", f"peak_rss_mb_{count}", 0),
            (f"{count:,}: Redis clients", f"redis_clients_{count}", 0),
        ]
    return cols


def cell(row: dict[str, Any], metric: str, decimals: int) -> str:
    if row.get("not_applicable"):
        return "n/a"
    stats = row["metrics"].get(metric)
    if stats is None:
        return "failed (see notes)" if row["failures"] else "-"
    text = f"{stats['median']:,.{decimals}f}"
    if stats["runs"] > 1:
        text += f" ({stats['min']:,.{decimals}f}..{stats['max']:,.{decimals}f})"
    return text


def table_rows(rows: list[dict[str, Any]], scenario: str, sizes: Sizes) -> list[list[str]]:
    cols = columns(scenario, sizes)
    out = [["peer", "mode", *(c[0] for c in cols)]]
    for row in rows:
        if row["scenario"] == scenario:
            out.append([row["peer"], row["mode"], *(cell(row, m, d) for _, m, d in cols)])
    return out


def notes(rows: list[dict[str, Any]]) -> list[str]:
    found = []
    for row in rows:
        where = f"{row['peer']} {row['scenario']} [{row['mode']}]"
        if row.get("not_applicable"):
            found.append(f"{row['peer']} {row['scenario']}: n/a, {row['not_applicable']}")
        for failure in dict.fromkeys(row["failures"]):
            found.append(f"{where}: {row['failures'].count(failure)} run(s) failed: {failure}")
    return found


def print_tables(rows: list[dict[str, Any]], sizes: Sizes) -> None:
    for letter, scenario in SCENARIOS.items():
        table = table_rows(rows, scenario, sizes)
        if len(table) == 1:
            continue
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        print(f"\n({letter}) {scenario}  - median (min..max) over runs")
        for line in table:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
    for note in notes(rows):
        print(f"note: {note}")


def markdown(doc: dict[str, Any]) -> str:
    meta, sizes = doc["meta"], Sizes(**{**doc["meta"]["sizes"]})
    sleepers = " and ".join(f"{n:,}" for n in sizes.sleepers)
    titles = {
        "enqueue": f"(a) Enqueue rate, one producer, {sizes.enqueue:,} no-op jobs",
        "drain": f"(b) Drain of {sizes.drain:,} queued no-op jobs by one worker process",
        "pickup": f"(c) Pickup latency on an idle worker ({sizes.pickup} jobs, one at a time)",
        "sleepers": f"(d) {sleepers} jobs that each sleep 2 s, one worker process",
    }
    lines = [
        "# backburner vs. peers on one Redis",
        "",
        f"Made by `bench/peers.py` (in the bench venv) on {meta['when']}: "
        f"{meta['cpus']} cores ({meta['machine']}), Python {meta['python']}, "
        f"Redis {meta['redis']} on loopback (db 8), backburner on `{meta['backburner_url']}`. "
        "Cells: median (min..max) over "
        f"{meta['runs']} run(s); the machine was shared, so expect noise. Each peer runs at "
        "the settings in its mode column; the producer is one asyncio or one blocking client "
        "in the benchmark process (an asyncio one on asyncio's own event loop, and also on "
        "uvloop's for the one-at-a-time enqueue), each worker its own process.",
        "",
        "Every job, whatever the queue, reports through one probe (`bench/peers/probe.py`): "
        "a per-process tally flushed to Redis every 10 ms, so a job costs no Redis round trip. "
        "Drain and sleeper times run from the first job's start to the last job's completion, "
        "as the jobs recorded them; pickup is the job's start time minus the time just before "
        "the producer's enqueue call. Peak RSS is VmHWM summed over the worker's processes; "
        "Redis clients is the peak `connected_clients` of the whole Redis server during the run "
        "(a run is stopped past 6,000: the server is shared and allows 10,000).",
    ]
    for scenario, title in titles.items():
        table = table_rows(doc["rows"], scenario, sizes)
        if len(table) == 1:
            continue
        lines += ["", f"## {title}", ""]
        lines.append("| " + " | ".join(table[0]) + " |")
        lines.append("|" + "---|" * len(table[0]))
        lines += ["| " + " | ".join(r) + " |" for r in table[1:]]
    lines += ["", "## Versions", "", "| package | version |", "|---|---|"]
    lines += [f"| {name} | {version} |" for name, version in sorted(doc["versions"].items())]
    lines += ["", "## How each peer is set up", ""]
    for name in sorted(doc["setups"], key=peer_order):
        lines.append(f"- **{name}**: {doc['setups'][name]}")
    found = notes(doc["rows"])
    if found:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in found]
    return "\n".join(lines) + "\n"


def to_rows(bench: Bench) -> list[dict[str, Any]]:
    return [
        {
            "scenario": row.scenario,
            "peer": row.peer,
            "mode": row.mode,
            "metrics": summarise(row.samples),
            "failures": row.failures,
            "not_applicable": row.not_applicable,
        }
        for row in bench.rows.values()
    ]


def merge(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Keep the rows of earlier runs (same sizes) of peers/scenarios not measured now."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return doc
    if old.get("meta", {}).get("sizes") != doc["meta"]["sizes"]:
        return doc
    measured = {(r["peer"], r["scenario"]) for r in doc["rows"]}
    kept = [r for r in old.get("rows", []) if (r["peer"], r["scenario"]) not in measured]
    rows = sorted(kept + doc["rows"], key=lambda r: peer_order(r["peer"]))
    return {
        **doc,
        "rows": rows,
        "versions": {**old.get("versions", {}), **doc["versions"]},
        "setups": {**old.get("setups", {}), **doc["setups"]},
    }


def peer_order(name: str) -> int:
    return list(PEERS).index(name) if name in PEERS else len(PEERS)


def write(doc: dict[str, Any], out: Path) -> None:
    doc = merge(out, doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(f"wrote {out} and {out.with_suffix('.md')}")


# -- command line ------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="runs per measurement (3)")
    parser.add_argument("--only", default=",".join(PEERS), help="peers, comma-separated")
    parser.add_argument("--scenarios", default="a,b,c,d", help="a,b,c,d (or their names)")
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 run, no files")
    parser.add_argument("--out", default=str(RESULTS / "peers.json"), help="JSON (+ .md) path")
    parser.add_argument(
        "--report-only", action="store_true", help="only rewrite the .md from the --out JSON"
    )
    parser.add_argument(
        "--backburner-url",
        default=os.environ.get("BENCH_BACKBURNER_URL", common.REDIS_URL),
        help="backburner's backend (default: Redis db 8)",
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    letters = {**SCENARIOS, **{v: v for v in SCENARIOS.values()}}
    wanted = [s for s in args.scenarios.split(",") if s]
    unknown = [n for n in names if n not in PEERS] + [s for s in wanted if s not in letters]
    if unknown:
        parser.error(f"unknown peer(s) or scenario(s): {', '.join(unknown)}")
    args.names = names
    args.scenario_names = [letters[s] for s in wanted]
    args.runs = args.runs or (1 if args.quick else 3)
    return args


def meta(args: argparse.Namespace, sizes: Sizes) -> dict[str, Any]:
    with common.redis_client() as client:
        redis_version = client.info("server")["redis_version"]
    return {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis": redis_version,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": args.runs,
        "sizes": {**asdict(sizes), "sleepers": list(sizes.sleepers)},
        "backburner_url": args.backburner_url,
    }


def stop_on_signals() -> None:
    """SIGTERM, and SIGINT even where a shell ignored it, unwind through the cleanup."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    args = parse_args()
    if args.report_only:
        out = Path(args.out)
        out.with_suffix(".md").write_text(markdown(json.loads(out.read_text())))
        print(f"wrote {out.with_suffix('.md')}")
        return
    os.environ["BENCH_BACKBURNER_URL"] = args.backburner_url
    sizes = QUICK if args.quick else Sizes()
    stop_on_signals()
    try:
        bench, peers = run(args.names, args.scenario_names, args.runs, sizes)
    finally:
        WorkerProcess.stop_all()
        try:
            common.flush()
        except common.BenchError as exc:  # the figures are measured: write them all the same
            print(f"warning: {exc}", file=sys.stderr)
    doc = {
        "meta": meta(args, sizes),
        "versions": versions(peers),
        "setups": {name: peer.setup for name, peer in peers.items()},
        "rows": to_rows(bench),
    }
    print_tables(doc["rows"], sizes)
    if not args.quick:
        write(doc, Path(args.out))


if __name__ == "__main__":
    main()
