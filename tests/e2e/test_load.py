"""Load: 20 plans at once on one SQLite checkpointer and one chromadb store; 40 briefs in a batch.

The batch is sized to show its property in about a minute rather than to be big: 40 briefs
cover every catalog model twice and every GPU type, node layout, sequence length, task and
batch size of ``brief`` (200 took ~6 minutes and proved nothing more), in one process that
plans them all, writes every folder and the index, and fails none.

Real components only: LangGraph's SqliteSaver on one sqlite3 connection shared by every thread
(as ``app.py report`` shares it), the persistent chromadb knowledge index that the researcher
searches, the compiled planning graph with the offline playbook model. No smoke runs.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from graphs import build_graph
from tools.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
THREADS = 20
BATCH = 40

# Catalog ids (knowledge/models/catalog.yaml) with the longest seq_len their position
# embeddings allow (None: no learned limit).
MODELS: dict[str, int | None] = {
    "gpt2": 1024,
    "gpt2-medium": 1024,
    "gpt2-large": 1024,
    "gpt2-xl": 1024,
    "llama-2-7b": None,
    "llama-2-13b": None,
    "llama-2-70b": None,
    "llama-3-8b": None,
    "llama-3-70b": None,
    "llama-3.1-405b": None,
    "mistral-7b": None,
    "mixtral-8x7b": None,
    "qwen2.5-0.5b": None,
    "qwen2.5-7b": None,
    "qwen2.5-72b": None,
    "phi-3-mini": None,
    "gemma-2-9b": None,
    "bert-base": 512,
    "t5-base": None,
    "vit-base": None,
}
GPUS = ("A100-80GB", "H100-80GB", "A100-40GB", "L40S", "H200", "RTX4090", "V100-32GB", "MI300X")
LAYOUTS = ("1x1", "1x2", "1x4", "1x8", "2x8", "4x8")
SEQ_LENS = (512, 1024, 2048, 4096)
TASKS = ("finetune", "pretrain", "lora")
BATCHES = (32, 64, 128, 256)


def brief(i: int) -> dict[str, Any]:
    """The i-th distinct, valid brief: model, GPU type and count, seq_len, task and goal vary."""
    names = list(MODELS)
    model = names[i % len(names)]
    limit = MODELS[model]
    seq_len = SEQ_LENS[(i // 3) % len(SEQ_LENS)]
    if limit is not None:
        seq_len = min(seq_len, limit)
    hardware = f"{LAYOUTS[(i // 2) % len(LAYOUTS)]}x{GPUS[(i // 5) % len(GPUS)]}"
    task = TASKS[(i // 7) % len(TASKS)]
    return {
        "goal": f"Load brief {i}: {task} {model} at {seq_len} tokens on {hardware}",
        "model": model,
        "task": task,
        "seq_len": seq_len,
        "global_batch_size": BATCHES[i % len(BATCHES)],
        "hardware": hardware,
        "precision": "bf16",
        "smoke": False,
    }


@contextmanager
def saver_on(db: str) -> Iterator[SqliteSaver]:
    """A SqliteSaver on one connection that every thread may use (as graphs/batch.py opens it)."""
    with closing(sqlite3.connect(db, check_same_thread=False)) as conn:
        yield SqliteSaver(conn)


def node_sequence(history: list[Any]) -> list[str]:
    """The nodes a thread ran, oldest first, from its checkpoint history (newest first)."""
    return [node for snap in reversed(history) for node in snap.next]


def store_ids(settings: Settings) -> set[str]:
    """The passage ids (``card#section``) in the chromadb store, read through chromadb itself."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    from knowledge.index import COLLECTION, MiniLMEmbeddingFunction

    client = chromadb.PersistentClient(
        path=str(settings.knowledge_index_dir),
        settings=ChromaSettings(anonymized_telemetry=False),
    )
    try:
        collection = client.get_collection(COLLECTION, embedding_function=MiniLMEmbeddingFunction())
        return set(collection.get(include=[])["ids"])
    finally:
        client.close()


DETERMINISTIC = ("brief", "model", "hardware", "framework", "memory", "deepspeed_config", "speed")


def test_twenty_parallel_plans_share_one_checkpointer_and_one_store(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    briefs = [brief(i) for i in range(THREADS)]
    assert len({json.dumps(b, sort_keys=True) for b in briefs}) == THREADS
    assert len({(b["model"], b["hardware"], b["seq_len"]) for b in briefs}) == THREADS
    threads = [f"load-{i:02d}" for i in range(THREADS)]
    db = str(tmp_path / "checkpoints.sqlite")
    start = threading.Barrier(THREADS)

    with saver_on(db) as saver:
        graph = build_graph(settings=settings, checkpointer=saver)  # one graph for all threads

        def run(i: int) -> dict[str, Any]:
            config = {"configurable": {"thread_id": threads[i]}}
            start.wait(timeout=120)  # all 20 invoke at once
            state = graph.invoke(
                {"brief": briefs[i], "out_dir": str(tmp_path / "par" / str(i))}, config
            )
            return dict(state["plan"])

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            futures = [pool.submit(run, i) for i in range(THREADS)]
            errors = [f.exception(timeout=600) for f in futures]
        parallel_s = time.perf_counter() - t0
        assert errors == [None] * THREADS, [repr(e) for e in errors if e]
        parallel = [f.result() for f in futures]
        histories = {
            tid: list(graph.get_state_history({"configurable": {"thread_id": tid}}))
            for tid in threads
        }
        listed = list(saver.list(None))
    print(f"\n{THREADS} plans in parallel threads: {parallel_s:.1f} s")

    # Each brief alone, one after the other, on its own checkpointer: the reference.
    t0 = time.perf_counter()
    alone, alone_nodes = [], []
    for i, b in enumerate(briefs):
        with saver_on(":memory:") as own:
            g = build_graph(settings=settings, checkpointer=own)
            config = {"configurable": {"thread_id": "alone"}}
            alone.append(
                g.invoke({"brief": b, "out_dir": str(tmp_path / "seq" / str(i))}, config)["plan"]
            )
            alone_nodes.append(node_sequence(list(g.get_state_history(config))))
    print(f"{THREADS} plans one after the other: {time.perf_counter() - t0:.1f} s")

    ids = store_ids(settings)
    assert ids, "the knowledge store is empty"
    for i, (got, want) in enumerate(zip(parallel, alone, strict=True)):
        for key in DETERMINISTIC:
            assert got[key] == want[key], f"thread {i}: {key} differs from the plan made alone"
        assert got["memory"]["chosen"] == want["memory"]["chosen"]
        assert got["review"]["verdict"] == want["review"]["verdict"]
        assert got["review"]["findings"] == want["review"]["findings"]
        assert got["brief"]["goal"] == briefs[i]["goal"]
        assert got["model"]["name"] == briefs[i]["model"]
        # Files went to this thread's folder, and say this thread's brief.
        report = Path(got["report"]["json"])
        assert report.parent == tmp_path / "par" / str(i)
        assert json.loads(report.read_text())["brief"]["goal"] == briefs[i]["goal"]
        # The researcher searched the store; every section it cites is a passage stored there.
        sections = [c for c in got["framework"]["citations"] if ".md#" in c]
        assert sections, f"thread {i}: no knowledge-store citation"
        for cite in sections:
            m = re.fullmatch(r"knowledge/cards/([^/]+)\.md#([^:]+): .+", cite)
            assert m and f"{m[1]}#{m[2]}" in ids, cite

    # Each thread's checkpoints: only its own brief, the nodes it ran once each, in order.
    assert {c.config["configurable"]["thread_id"] for c in listed} == set(threads)
    for i, tid in enumerate(threads):
        history = histories[tid]
        assert len([c for c in listed if c.config["configurable"]["thread_id"] == tid]) == len(
            history
        )
        assert {s.config["configurable"]["thread_id"] for s in history} == {tid}
        checkpoint_ids = [s.config["configurable"]["checkpoint_id"] for s in history]
        assert len(set(checkpoint_ids)) == len(checkpoint_ids), f"{tid}: duplicate checkpoints"
        steps = [s.metadata["step"] for s in reversed(history)]
        assert steps == list(range(-1, len(history) - 1)), f"{tid}: steps {steps}"
        nodes = node_sequence(history)
        assert nodes == alone_nodes[i], f"{tid}: ran {nodes}, alone {alone_nodes[i]}"
        assert nodes[:5] == ["__start__", "intake", "researcher", "engineer", "reviewer"]
        assert nodes[-1] == "reporter"
        for snap in history:
            seen = snap.values.get("brief")
            assert seen in (None, briefs[i], parallel[i]["brief"]), f"{tid}: foreign brief {seen}"
            plan = snap.values.get("plan")
            assert plan is None or plan["brief"]["goal"] == briefs[i]["goal"]
        assert history[0].values["plan"]["brief"] == parallel[i]["brief"]
        assert not history[0].next
    assert not [r for r in caplog.records if r.levelno >= 40], "errors were logged"


def test_twenty_threads_search_one_store_at_once(settings: Settings) -> None:
    """The knowledge search from 20 threads at once gives what it gives one query at a time."""
    from tools.research.knowledge import search_knowledge

    queries = [
        f"when to choose ZeRO stage {stage} for {gpus} GPUs and {what}"
        for stage in (1, 2, 3)
        for gpus in (1, 8, 64, 512)
        for what in ("a 7B model", "long sequences", "a small cluster", "offload to CPU", "LoRA")
    ]
    want = {q: search_knowledge(q, settings, k=4) for q in queries}
    start = threading.Barrier(THREADS)

    def run(i: int) -> dict[str, Any]:
        start.wait(timeout=120)
        return {q: search_knowledge(q, settings, k=4) for q in queries[i::THREADS]}

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(run, i) for i in range(THREADS)]
        errors = [f.exception(timeout=600) for f in futures]
    assert errors == [None] * THREADS, [repr(e) for e in errors if e]
    got = {q: found for f in futures for q, found in f.result().items()}
    assert sorted(got) == sorted(queries)
    for q in queries:
        assert [(p.card, p.section) for p in got[q]] == [(p.card, p.section) for p in want[q]], q
        assert [p.score for p in got[q]] == pytest.approx([p.score for p in want[q]], abs=1e-3)


PER_BRIEF = re.compile(r"^\[\d+/\d+\] (\S+): ok \(.*\) in ([0-9.]+) s$", re.M)


def test_forty_briefs_in_one_batch(tmp_path: Path, knowledge_dir: Path) -> None:
    src = tmp_path / "briefs"
    src.mkdir()
    names = []
    for i in range(BATCH):
        b = brief(i)
        name = f"b{i:03d}-{b['model']}"
        names.append(name)
        lines = [f"{k}: {json.dumps(v)}" for k, v in b.items()]
        (src / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    assert len({(src / f"{n}.yaml").read_text() for n in names}) == BATCH
    # Every value that ``brief`` varies occurs in the batch (the coverage 200 briefs had).
    made = [brief(i) for i in range(BATCH)]
    assert {b["model"] for b in made} == set(MODELS)
    assert {b["hardware"].split("x", 2)[2] for b in made} == set(GPUS)
    assert {b["hardware"].rsplit("x", 1)[0] for b in made} == set(LAYOUTS)
    assert {b["task"] for b in made} == set(TASKS)
    assert {b["global_batch_size"] for b in made} == set(BATCHES)
    out = tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if k != "TRAINWRIGHT_DEBUG"}
    env |= {
        "TRAINWRIGHT_HOME": str(tmp_path / "home"),
        "TRAINWRIGHT_OUT": str(tmp_path / "out"),
        "TRAINWRIGHT_KNOWLEDGE_DIR": str(knowledge_dir),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "app.py", "report", str(src), "--out", str(out), "--no-smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    times = {name: float(s) for name, s in PER_BRIEF.findall(proc.stderr)}
    assert sorted(times) == names
    print(
        f"\n{BATCH} briefs in one batch: {wall:.1f} s wall, {wall / BATCH:.3f} s per brief; "
        f"per-brief planning time (2 at once) median {statistics.median(times.values()):.2f} s, "
        f"max {max(times.values()):.2f} s"
    )
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == names
    for name in names:
        for f in ("plan.json", "report.md", "report.html", ".batch-inputs.json"):
            assert (out / name / f).is_file(), f"{name}/{f} missing"
    index = (out / "index.md").read_text()
    assert f"{BATCH} brief(s): {BATCH} planned, 0 failed." in index
    rows = [line for line in index.splitlines() if re.match(r"\| b\d{3}-", line)]
    assert len(rows) == BATCH
    assert all(f"[report]({name}/report.md)" in index for name in names)
    assert "error:" not in index
    # Each folder holds its own brief's plan.
    for i in (0, 1, BATCH // 2, BATCH - 1):
        plan = json.loads((out / names[i] / "plan.json").read_text())
        assert plan["brief"]["goal"] == brief(i)["goal"]
        assert plan["smoke_test"]["status"] == "skipped"
