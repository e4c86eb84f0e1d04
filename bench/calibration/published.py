"""The speed model against published training throughputs: ``python bench/calibration/published.py``.

Reads ``throughput.tsv`` of the published-measurements folder (``../shared/published`` from
the repository root, or ``TRAINWRIGHT_PUBLISHED=DIR``), turns each row into the inputs the
planner would have (a model built from the row's architecture columns, the catalog GPU, the
row's setup) and calls ``tools.planning.speed.estimate_speed`` for exactly that setup, pinned,
no search. The prediction is compared with the row's measured tokens/s per GPU.

Nothing of the published data is stored: ``--json FILE`` writes aggregates only (counts,
medians, shares), and the per-row ratios go to stdout. The folder's README lists the caveats
(MFU definitions, torchtitan's 500 W H100s, FP8 rows); the mapping below follows them.

Calibration split: a row is ``fit`` when ``int(sha256(row_id), 16) % 4 == 0`` and ``held-out``
otherwise. The rule depends on the row id alone, so it is the same on every run and on every
machine, whatever rows are added; the speed model's free constants may be fitted on the
``fit`` rows only (``fit_rows()``), and its accuracy is quoted on ``held_out_rows()``.

Exit codes: 0 (also when the folder is absent: one line says so), 2 for bad input (one line).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.core.errors import InputError, one_line  # noqa: E402
from tools.core.schemas import HardwareSpec, ModelSpec, SpeedEstimate  # noqa: E402

ENV_VAR = "TRAINWRIGHT_PUBLISHED"
DEFAULT_DIR = ROOT.parent / "shared" / "published"
# The project's own published measurements (other GPUs, MoE), same layout, ids X0001...
EXTRA_DIR = ROOT / "bench" / "calibration" / "published_extra"
TSV = "throughput.tsv"
SPLITS = ("fit", "held-out", "all")
# The share of rows the fit split takes: one in FIT_MODULUS row ids (by hash, not by order).
FIT_MODULUS = 4
# The columns the mapping reads; a file without them is not this layout (exit 2).
REQUIRED_COLUMNS = (
    "row_id", "source", "framework", "model", "n_layers", "hidden", "n_heads", "n_kv_heads",
    "ffn_hidden", "vocab", "seq_len", "gpu", "n_gpus", "dp", "dp_sharding", "tp", "pp", "vpp",
    "cp", "act_ckpt", "micro_batch", "grad_accum", "global_batch_seqs", "precision",
    "tokens_per_s_total", "tokens_per_s_per_gpu", "samples_per_s",
)  # fmt: skip
GPUS_PER_NODE = 8  # HGX/DGX A100, H100, H200, B200 nodes hold 8 GPUs (NVIDIA DGX datasheets)
DGX2_GPUS = 16  # a DGX-2 holds 16 V100s on NVSwitch (NVIDIA DGX-2 datasheet)
# Megatron-LM 2021 ran on Selene: 8 x 200 Gb/s HDR InfiniBand per DGX A100 node (Narayanan et
# al. 2021, arXiv:2104.04473 sec. 5: eight Mellanox 200 Gb/s HDR InfiniBand HCAs per node).
SELENE_NICS, SELENE_NIC_GBPS = 8, 200.0
WITHIN = (0.10, 0.20)
RANK_OK = 0.95  # a grid's pick counts as good when it reaches 95% of the best measured

Row = dict[str, str]


@dataclass
class Case:
    """One published row turned into the speed model's inputs, and the measured answer."""

    row_id: str
    source: str
    split: str
    model: ModelSpec
    hardware: HardwareSpec
    setup: dict[str, Any]
    measured: float
    measured_how: str
    grid: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    predicted: float | None = None

    @property
    def ratio(self) -> float:
        """Predicted / measured tokens/s per GPU."""
        assert self.predicted is not None
        return self.predicted / self.measured


@dataclass
class Skip:
    """A row the bench cannot compare, and why."""

    row_id: str
    source: str
    split: str
    reason: str


class _Skipped(Exception):
    """Raised inside the mapping; becomes a Skip with this reason."""


# --- the folder, the split --------------------------------------------------------------------


def published_dir() -> Path:
    """``$TRAINWRIGHT_PUBLISHED`` when set, else ``../shared/published`` from the repository."""
    env = os.environ.get(ENV_VAR, "").strip()
    return Path(env) if env else DEFAULT_DIR


def read_rows(folder: Path | None = None) -> list[Row]:
    """The rows of ``throughput.tsv``; InputError when the file is missing or not this layout."""
    path = (folder or published_dir()) / TSV
    if not path.is_file():
        raise InputError(ENV_VAR, f"no {TSV} in {path.parent}")
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(ENV_VAR, f"{path} lacks the column(s) {', '.join(missing)}")
        rows = [{k: (v or "").strip() for k, v in r.items() if k is not None} for r in reader]
    ids = Counter(r["row_id"] for r in rows)
    dup = [i for i, n in ids.items() if n > 1 or not i]
    if dup:
        raise InputError(ENV_VAR, f"{path}: row_id empty or repeated ({', '.join(dup[:3])})")
    return rows


def split_of(row_id: str) -> str:
    """``fit`` when sha256(row_id) mod 4 == 0, else ``held-out``: fixed by the id alone."""
    digest = int(hashlib.sha256(row_id.encode("utf-8")).hexdigest(), 16)
    return "fit" if digest % FIT_MODULUS == 0 else "held-out"


def fit_rows(folder: Path | None = None) -> list[Row]:
    """The rows the speed model's free constants may be fitted on."""
    return [r for r in read_rows(folder) if split_of(r["row_id"]) == "fit"]


def held_out_rows(folder: Path | None = None) -> list[Row]:
    """The rows accuracy is quoted on (never used for fitting)."""
    return [r for r in read_rows(folder) if split_of(r["row_id"]) == "held-out"]


def check_split(split: str) -> str:
    """fit, held-out or all; InputError otherwise."""
    if split not in SPLITS:
        raise InputError("split", f"use one of {', '.join(SPLITS)}, got {split!r}")
    return split


# --- row -> inputs ----------------------------------------------------------------------------


def source_of(row: Row) -> str:
    """llm-foundry, torchtitan or Megatron-LM: the repository the row's ``source`` names."""
    cell = row["source"].strip()
    github = re.match(r"https?://github\.com/[^/]+/([^/#?]+)", cell)
    if github:  # an issue or pull request thread: the repository it is filed in
        return github[1]
    repo = cell.split("@")[0].split(":")[0].strip()
    return repo.split("/")[-1] if "/" in repo else repo or "unknown"


def _int(cell: str, what: str, *, required: bool = True) -> int | None:
    """The leading whole number of a cell ("8192 (toml default)", "local bs 8")."""
    match = re.match(r"^\s*(?:local bs\s*)?(\d[\d,]*)", cell or "")
    if match is None:
        if required:
            raise _Skipped(f"{what} not stated as a number")
        return None
    return int(match[1].replace(",", ""))


def _need(cell: str, what: str) -> int:
    """The leading whole number of a cell; the row is skipped without one."""
    value = _int(cell, what)
    assert value is not None  # _int raised otherwise
    return value


def _opt(cell: str, what: str, default: int = 1) -> int:
    """The cell's whole number, ``default`` when the cell is empty."""
    return _need(cell, what) if cell else default


def _float(cell: str) -> float | None:
    match = re.match(r"^\s*(\d[\d,]*(?:\.\d+)?)", cell or "")
    return float(match[1].replace(",", "")) if match else None


def _family(row: Row) -> str:
    """The HF model_type each source's models are.

    llm-foundry benchmarks MPT (GPT-style, ALiBi, 4h GELU MLP; the folder's README);
    torchtitan Llama 3 (gated SiLU MLP, GQA; torchtitan/models/llama3); Megatron-LM 2021
    GPT (4h GELU MLP, learned positions; Narayanan et al. 2021 sec. 5).
    """
    source = source_of(row)
    if source == "llm-foundry":
        return "mpt"
    if source == "torchtitan" and row["model"].lower().startswith("llama"):
        return "llama"
    if source == "Megatron-LM":
        return "gpt2"
    name = row["model"].lower()
    family = next((f for key, f in NAME_FAMILIES if key in name), None)
    if family is None:
        raise _Skipped(
            "model family not known (mapped: MPT, Llama, GPT-2, and by name "
            + ", ".join(k for k, _ in NAME_FAMILIES)
            + ")"
        )
    return family


# Families recognised by the model name, for sources other than the three above; each is
# built from the row's architecture columns as transformers' config of that model_type.
NAME_FAMILIES: tuple[tuple[str, str], ...] = (
    ("gpt-oss", "gpt_oss"),
    ("mixtral", "mixtral"),
    # FlagPerf's qwen1.5_MoE case trains the script's MoE: 8 SwiGLU experts, top-2 (the
    # Mixtral block), not the released Qwen1.5-MoE-A2.7B.
    ("qwen1.5-moe", "mixtral"),
    # Qwen3's mixtures of experts (Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B config.json): every
    # layer sparse, heads of an explicit width (head_dim in the notes). Dense Qwen3 is not
    # mapped (model_config skips it).
    ("qwen3", "qwen3_moe"),
    ("llama", "llama"),
    # GPT-2 by name (SemiAnalysis' llm-train-bench GPT-2 XL in ROCm/TransformerEngine issues
    # #72 and #76): learned positions, 4h GELU MLP, tied embeddings, as Megatron-LM's GPT.
    ("gpt-2", "gpt2"),
    ("mistral", "llama"),  # Mistral 7B is the Llama block with GQA (Jiang et al. 2023, Table 1)
)
EXPERTS = re.compile(r"experts=(\d+)\s+top_k=(\d+)")
HEAD_DIM = re.compile(r"head_dim=(\d+)")


def experts_of(row: Row) -> tuple[int, int]:
    """(routed experts, top-k) of a MoE row, from ``experts=E top_k=K`` in its notes."""
    match = EXPERTS.search(row.get("notes", ""))
    if match is None:
        raise _Skipped("mixture of experts without 'experts=E top_k=K' in the notes")
    return int(match[1]), int(match[2])


def model_config(row: Row) -> dict[str, Any]:
    """A Hugging Face config dict of the row's family, from its architecture columns only."""
    family = _family(row)
    need = ["n_layers", "hidden", "n_heads", "vocab"] + (
        ["ffn_hidden"] if family == "llama" else []
    )
    missing = [c for c in need if _int(row[c], c, required=False) is None]
    if missing:
        raise _Skipped(f"architecture columns empty ({', '.join(missing)})")
    layers, hidden, heads, vocab = (_need(row[c], c) for c in need[:4])
    if family == "mpt":
        ffn = _int(row["ffn_hidden"], "ffn_hidden", required=False) or 4 * hidden
        if ffn % hidden:
            raise _Skipped("MPT ffn_hidden is not a whole multiple of hidden")
        # transformers' MptConfig: ALiBi attention (no position table), expansion_ratio x d_model
        # GELU MLP, no biases, tied embeddings (llm-foundry mpt-*.yaml defaults). Positions are
        # ALiBi, so max_seq_len does not change the count and is fixed to share one count.
        return {
            "model_type": "mpt",
            "d_model": hidden,
            "n_heads": heads,
            "n_layers": layers,
            "expansion_ratio": ffn // hidden,
            "max_seq_len": 2048,
            "vocab_size": vocab,
            "no_bias": True,
            "attn_config": {"alibi": True},
        }
    if family == "qwen3_moe" and row.get("model_type", "").lower() != "moe":
        raise _Skipped("dense Qwen3 is not mapped (only Qwen3's mixtures of experts)")
    if family in ("gpt_oss", "mixtral", "qwen3_moe"):
        return moe_config(row, family, layers, hidden, heads, vocab)
    if family == "llama":
        from tools.research.architectures import llama_config

        kv = _int(row["n_kv_heads"], "n_kv_heads", required=False) or heads
        ffn = _need(row["ffn_hidden"], "ffn_hidden")
        # RoPE: max_position_embeddings does not change the count; Llama 3.1's 131072
        # (meta-llama/Llama-3.1-8B config.json) keeps one count per architecture.
        config = llama_config(layers, hidden, heads, kv, vocab, ffn, 131072)
        config["rope_theta"] = 500000.0  # Llama 3 (Grattafiori et al. 2024, Table 3)
        return config
    # GPT-2 style (Megatron-LM's GPT): learned positions for the row's sequence, 4h GELU MLP.
    return {
        "model_type": "gpt2",
        "n_embd": hidden,
        "n_head": heads,
        "n_layer": layers,
        "n_positions": _int(row["seq_len"], "seq_len"),
        "vocab_size": vocab,
    }


def moe_config(
    row: Row, family: str, layers: int, hidden: int, heads: int, vocab: int
) -> dict[str, Any]:
    """Transformers' GptOssConfig / MixtralConfig / Qwen3MoeConfig from the columns and notes.

    GPT-OSS (openai/gpt-oss-120b config.json): head_dim 64, sliding window 128 on alternate
    layers, expert width = ffn_hidden. Mixtral (mistralai/Mixtral-8x7B-v0.1 config.json):
    the Mistral block, every MLP a top-k of E experts of width ffn_hidden.
    """
    experts, top_k = experts_of(row)
    kv = _int(row["n_kv_heads"], "n_kv_heads", required=False) or heads
    ffn = _need(row["ffn_hidden"], "ffn_hidden")
    config: dict[str, Any] = {
        "model_type": family,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": ffn,
        "num_local_experts": experts,
        "num_experts_per_tok": top_k,
        "vocab_size": vocab,
        "max_position_embeddings": 131072,
    }
    if family == "gpt_oss":
        config.update({"head_dim": 64, "sliding_window": 128})
    if family == "qwen3_moe":
        # Qwen3MoeConfig names the routed experts num_experts and their width
        # moe_intermediate_size; intermediate_size (the dense MLP, unused when every layer is
        # sparse: decoder_sparse_step 1, mlp_only_layers []) is top_k x the expert width in
        # both released configs (6144, 12288).
        head = HEAD_DIM.search(row.get("notes", ""))
        if head is None:
            raise _Skipped("Qwen3 MoE without 'head_dim=D' in the notes")
        del config["num_local_experts"]
        config.update(
            {
                "num_experts": experts,
                "moe_intermediate_size": ffn,
                "intermediate_size": top_k * ffn,
                "head_dim": int(head[1]),
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "norm_topk_prob": True,
                "tie_word_embeddings": False,
            }
        )
    return config


def build_model(row: Row) -> ModelSpec:
    """The row's architecture as the planner sees a model (counted on meta by transformers)."""
    from tools.research.model_catalog import lookup_model

    seq = _need(row["seq_len"], "seq_len")
    config = model_config(row)
    try:
        spec = lookup_model(config, seq)
    except InputError as exc:
        raise _Skipped(f"model not buildable: {exc.field}") from None
    return spec.model_copy(update={"name": row["model"] or spec.name})


# (substring of the lower-cased gpu cell, catalog id, note); the first match wins.
GPU_RULES: tuple[tuple[str, str, str], ...] = (
    ("h100_80gb", "H100-80GB", ""),
    ("a100_40gb", "A100-40GB", ""),
    ("a100_80gb", "A100-80GB", ""),
    (
        "h100 sxm 9",
        "H100-80GB",
        "96/95 GB HBM2e H100s at a 500 W cap run lower clocks than the SXM5 80 GB datasheet "
        "(the folder's README); the catalog H100 is used, no derate invented",
    ),
    ("a100 80gb", "A100-80GB", ""),
    ("a100 sxm4 40gb", "A100-40GB", ""),
    ("h100 sxm 80gb", "H100-80GB", ""),
    (
        "v100 sxm3 32gb",
        "V100-32GB",
        "DGX-2's V100 SXM3 32GB: the catalog V100 SXM2 32GB (same tensor rate)",
    ),
    ("v100", "V100-16GB", ""),
    ("a800", "A800-80GB", ""),
    ("h800", "H800", ""),
    ("h100-sxm-80gb", "H100-80GB", ""),
    ("l40s", "L40S", ""),
    ("l4", "L4", ""),
    ("a10g", "A10G", ""),
    ("t4", "T4", ""),
    ("rtx 3090", "RTX3090", ""),
    ("rtx 4090", "RTX4090", ""),
    ("a6000", "RTX-A6000", ""),
    ("mi300x", "MI300X", ""),
    ("mi250", "MI250X", ""),
    ("h200", "H200", ""),
    (
        "b200 (power limited)",
        "B200",
        "power-limited B200 (the source names no cap): the catalog B200 is the full-power "
        "datasheet, so the prediction is for a B200 at full power and these rows are expected "
        "over; no derate is invented (the same model on full-power DGX-B200s, Megatron-Bridge "
        "X0038-X0039 of published_extra, ran about 3x their tokens/s)",
    ),
    ("b200", "B200", ""),
    ("blackwell", "B200", "Blackwell part not named: the catalog B200 is assumed"),
)


def build_hardware(row: Row) -> tuple[HardwareSpec, list[str]]:
    """The catalog GPU, nodes of 8 (fewer GPUs: one node); Selene's network for Megatron-LM."""
    from tools.research.hardware import parse_hardware

    cell = row["gpu"].lower()
    rule = next((r for r in GPU_RULES if r[0] in cell), None)
    if rule is None:
        raise _Skipped("GPU not mapped to the catalog")
    n = _need(row["n_gpus"], "n_gpus")
    if n < 1:
        raise _Skipped("n_gpus not stated as a number")
    size = DGX2_GPUS if "dgx-2" in cell else GPUS_PER_NODE
    if n > size and n % size:
        raise _Skipped(f"n_gpus is not whole nodes of {size}")
    nodes, per_node = (n // size, size) if n >= size else (1, n)
    hw = parse_hardware(f"{nodes}x{per_node}x{rule[1]}")
    notes = [rule[2]] if rule[2] else []
    if source_of(row) == "Megatron-LM":
        hw = hw.model_copy(update={"nics_per_node": SELENE_NICS, "nic_gbps": SELENE_NIC_GBPS})
        notes.append("network: Selene, 8 x 200 Gb/s HDR InfiniBand per node (the paper)")
    return hw, notes


def strategy_of(row: Row) -> str:
    """FULL_SHARD / FSDP2 -> zero3, SHARD_GRAD_OP -> zero2, DDP (and Megatron-LM) -> ddp."""
    cell = row["dp_sharding"].upper()
    if "SHARD_GRAD_OP" in cell:
        return "zero2"
    if "FULL_SHARD" in cell or cell.startswith("FSDP2"):
        return "zero3"
    if cell.startswith("DDP") or (not cell and source_of(row) == "Megatron-LM"):
        return "ddp"
    zero = re.search(r"ZERO[- ]?(?:STAGE )?([123])", cell)
    if zero:
        return ("zero1", "zero2", "zero3")[int(zero[1]) - 1]  # type: ignore[return-value]
    if cell.startswith("MEGATRON DDP"):
        return "ddp"
    if "DISTRIBUTED OPTIMIZER" in cell:
        return "zero1"  # Megatron's distributed optimizer shards optimizer states over DP
    raise _Skipped("dp_sharding not mapped to a strategy")


# The recompute policy when the row leaves act_ckpt empty, and why.
DEFAULT_RECOMPUTE = {
    # torchtitan/models/llama3/train_configs/llama3_8b.toml: [activation_checkpoint]
    # mode = "selective", selective_ac_option = "op".
    "torchtitan": ("selective", "torchtitan's llama3 toml default is selective (per-op) AC"),
    # Narayanan et al. 2021 (sec. 3.5, and the rows' notes): activation recomputation on.
    "Megatron-LM": ("full", "Megatron-LM 2021 recomputes activations in every run (the paper)"),
}


# Megatron-Core's output-discarding recompute modules that hold no matmul (MoE README).
MEMORY_BOUND_MODULES = {"layernorm", "moe_act"}


def recompute_of(row: Row) -> tuple[str, str]:
    """The recompute policy (none, selective, full) from act_ckpt; empty: the framework's default, with the reason."""
    cell = row["act_ckpt"].lower()
    if cell.split(" ")[0] in ("none", "full"):
        return cell.split(" ")[0], ""
    if "core attention only" in cell:
        return "none", (
            "Megatron's --recompute-activations recomputes only the core attention (Korthikanti "
            "et al. 2022 sec. 5), which FlashAttention's backward recomputes anyway: no GEMMs"
        )
    modules = re.search(r"recompute_modules\s+([\w ,]+)", cell)
    if modules and set(re.findall(r"\w+", modules[1])) <= MEMORY_BOUND_MODULES:
        return "none", (
            "Megatron's recompute_modules " + modules[1].strip() + " re-run memory-bound ops "
            "only (Megatron-Core MoE README, output-discarding checkpointing), no GEMMs"
        )
    if cell.startswith("selective"):
        return "selective", ""
    if not cell and source_of(row) in DEFAULT_RECOMPUTE:
        return DEFAULT_RECOMPUTE[source_of(row)]
    raise _Skipped("act_ckpt not mapped to a recompute policy")


LOW_PRECISION = ("fp8", "float8", "fp4", "mxfp", "nvfp")
# fp8 linears, as each source names them: llm-foundry's amp_fp8 (Transformer Engine fp8),
# torchtitan's "Float8 linears" / "float8" tensorwise or rowwise (torchao Float8Linear) and
# mxfp8 (torchao MX, block-scaled FP8 on Blackwell, which NVIDIA's Blackwell datasheets rate at
# the FP8 peak: one FP8/FP6 row). FP4 (NVFP4, MXFP4) has no path.
FP8_WORDS = ("fp8", "float8")
FP4_WORDS = ("fp4", "nvfp")


def precision_of(row: Row) -> str:
    """bf16, fp16 or fp8 (fp8 linears over bf16); FP4 rows are skipped."""
    cell = row["precision"].lower()
    if any(w in cell for w in FP4_WORDS):
        raise _Skipped("fp4 (NVFP4/MXFP4): the speed model has an fp8 path only")
    if any(w in cell for w in FP8_WORDS):
        return "fp8"
    if "fp16" in cell and "bf16" not in cell:
        return "fp16"
    if "bf16" in cell or "bfloat16" in cell:
        return "bf16"
    raise _Skipped("precision not mapped (bf16/fp16/fp8 only)")


def fp8_all_gather(row: Row) -> bool:
    """Whether the row says FSDP all-gathers its weights in float8 (torchtitan's option)."""
    text = f"{row['precision']} {row.get('notes', '')}".lower()
    return "float8 all-gather" in text or "float8_all_gather" in text


# torchtitan's JobConfig: parallelism.pipeline_parallel_microbatch_size = 1, so a pipeline's
# local batch runs as that many micro-batches of one sequence (torchtitan/config/job_config.py).
TORCHTITAN_PP_MICROBATCH = 1


def setup_of(row: Row) -> tuple[dict[str, Any], list[str]]:
    """estimate_speed's setup keywords from the row's parallelism and batch columns."""
    notes: list[str] = []
    n = _need(row["n_gpus"], "n_gpus")
    tp = _opt(row["tp"], "tp")
    pp = _opt(row["pp"], "pp")
    cp = _opt(row["cp"], "cp")
    vpp = _opt(row["vpp"], "vpp")
    ep = _opt(row.get("ep", ""), "ep")
    if n % (tp * pp * cp):
        raise _Skipped("n_gpus does not divide by tp x pp x cp")
    dp = _int(row["dp"], "dp", required=False) or n // (tp * pp * cp)
    if dp * tp * pp * cp != n:
        raise _Skipped("dp x tp x pp x cp != n_gpus")
    micro = _need(row["micro_batch"], "micro_batch")
    accum = _int(row["grad_accum"], "grad_accum", required=False)
    if accum is None:
        gbs = _int(row["global_batch_seqs"], "global_batch_seqs", required=False)
        if gbs is not None:
            if gbs % (micro * dp):
                raise _Skipped("global_batch_seqs does not divide by micro_batch x dp")
            accum = gbs // (micro * dp)
            notes.append("grad_accum = global_batch_seqs / (micro_batch x dp)")
        elif source_of(row) == "torchtitan":
            accum = 1  # torchtitan steps once per local batch unless gradient accumulation is set
            notes.append("grad_accum 1 (torchtitan's default: none)")
        else:
            raise _Skipped("grad_accum not stated and no global batch to derive it")
    if pp > 1 and source_of(row) == "torchtitan":
        # The local batch is split into pipeline micro-batches of the default size.
        accum = accum * micro // TORCHTITAN_PP_MICROBATCH
        micro = TORCHTITAN_PP_MICROBATCH
        notes.append("pipeline micro-batch 1 (torchtitan default), local batch = micro-batches")
    if micro < 1 or accum < 1:
        raise _Skipped("micro_batch or grad_accum below 1")
    recompute, why = recompute_of(row)
    if why:
        notes.append(f"recompute {recompute}: {why}")
    setup = {
        "strategy": strategy_of(row),
        "micro_batch_size": micro,
        "gradient_accumulation_steps": accum,
        "precision": precision_of(row),
        "seq_len": _need(row["seq_len"], "seq_len"),
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "virtual_stages": vpp,
        "context_parallel": cp,
        "recompute": recompute,
    }
    if setup["precision"] == "fp8" and fp8_all_gather(row):
        setup["fp8_all_gather"] = True
        notes.append("FSDP float8 all-gather (the row says so)")
    if tp > 1 and "no sequence parallelism" in row.get("notes", ""):
        # Megatron before 2022 all-reduced tensor-parallel activations and ran norms and
        # dropout on the whole sequence on every rank (Korthikanti et al. 2022 introduced
        # sequence parallelism); the speed model's default is Megatron's current one.
        setup["sequence_parallel"] = False
        notes.append("sequence parallelism off: the row's notes say the run predates it")
    if "unfused attention" in row.get("notes", "").lower():
        # Before FlashAttention (Dao et al. 2022) Megatron computed the s x s scores, a fused
        # scale-mask-softmax over them in HBM, and the product with V: the speed model's
        # ``eager`` attention kernel, not its FlashAttention-style default.
        setup["attention"] = "eager"
        notes.append("attention with materialised scores: the row's notes say it ran unfused")
    elif transformer_engine(row):
        # Transformer Engine's DotProductAttention runs cuDNN's fused attention on Hopper and
        # later (tools/planning/attention_kernels.py); elsewhere the ``cudnn`` kernel is priced
        # as FlashAttention-2.
        setup["attention"] = "cudnn"
        notes.append("attention: Transformer Engine's (cuDNN fused attention on Hopper and later)")
    if ep > 1:
        if dp % ep:
            raise _Skipped("ep does not divide the data-parallel degree")
        setup["expert_parallel"] = ep
    return setup, notes


# The framework column's words for a run whose layers are Transformer Engine's: Megatron-Core
# with its TE layer spec, NeMo and Megatron-Bridge (which build Megatron-Core models with it).
TE_WORDS = re.compile(r"transformer[_ ]engine|\bTE\b|Megatron-Bridge|NeMo", re.IGNORECASE)


def transformer_engine(row: Row) -> bool:
    """Whether the row's framework says its layers ran on Transformer Engine."""
    return bool(TE_WORDS.search(row.get("framework", "")))


def megatron_tokens_per_s(row: Row, tflops: float) -> float:
    """Tokens/s per GPU from achieved TFLOP/s, by the paper's FLOP count with recomputation.

    Narayanan et al. 2021 (arXiv:2104.04473) eq. 3: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    FLOPs per iteration of B sequences of s tokens, so per token F / (B s).
    """
    s, layers, h, v = (_need(row[c], c) for c in ("seq_len", "n_layers", "hidden", "vocab"))
    per_token = 96 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return tflops * 1e12 / per_token


def measured_of(row: Row) -> tuple[float, str]:
    """The measured tokens/s per GPU and how it was read (derived ones say so)."""
    n = _need(row["n_gpus"], "n_gpus")
    per_gpu = _float(row["tokens_per_s_per_gpu"])
    if per_gpu:
        derived = "(derived)" in row["tokens_per_s_per_gpu"]
        return per_gpu, "tokens_per_s_per_gpu" + (" (derived)" if derived else "")
    total = _float(row["tokens_per_s_total"])
    if total:
        return total / n, "tokens_per_s_total / n_gpus (derived)"
    samples = _float(row["samples_per_s"])
    seq = _int(row["seq_len"], "seq_len", required=False)
    if samples and seq:
        return samples * seq / n, "samples_per_s x seq_len / n_gpus (derived)"
    tflops = _float(row.get("tflops_per_gpu", ""))
    if tflops and source_of(row) == "Megatron-LM":
        return megatron_tokens_per_s(row, tflops), "tflops_per_gpu / paper eq. 3 FLOPs (derived)"
    raise _Skipped("no measured throughput in the row")


# The band a row's own TFLOP/s per GPU over its tokens/s may sit in, as a share of PaLM's
# 6N + 12·L·h·s model FLOPs, before the row contradicts itself: sources halve causal attention
# or window it (GPT-OSS rows: 0.65) and count full recomputation (4/3: Megatron's HFU-like
# figure, 1.33 on its rows); the published rows of both folders span 0.65-1.33 but one.
CONSISTENT = (0.5, 1.5)


def check_consistent(row: Row, model: Any, measured: float, seq_len: int) -> None:
    """Skip a row whose printed tokens/s and TFLOP/s per GPU disagree (outside ``CONSISTENT``).

    Such a row has a misprint in one of the two figures and cannot say which; the comparison
    names it rather than scoring the model against either (Megatron-Bridge's 26.02 H100
    Qwen3-30B row prints 2,557 tokens/s at 118 TFLOP/s, 46 GFLOP per token, where its 25.11 row
    prints about the same TFLOP/s at twice the tokens/s).
    """
    from tools.planning.flops import training_flops_per_token

    tflops = _float(row.get("tflops_per_gpu", ""))
    if not tflops or "(derived)" in row.get("tflops_per_gpu", ""):
        return
    implied = tflops * 1e12 / measured
    modelled = training_flops_per_token(model, seq_len, activation_checkpointing=False)
    if not CONSISTENT[0] <= implied / modelled <= CONSISTENT[1]:
        raise _Skipped(
            f"the row's tokens/s and TFLOP/s per GPU disagree: {implied / 1e9:.0f} GFLOP per "
            f"token implied, {modelled / 1e9:.0f} by 6N + 12·L·h·s"
        )


def precision_group(row: Row) -> str:
    """The precision a grid is kept within."""
    cell = row["precision"].lower()
    if any(w in cell for w in LOW_PRECISION):
        return "low"
    return "fp16" if "fp16" in cell and "bf16" not in cell else "bf16"


def software_group(row: Row) -> str:
    """What else the run switched on that the speed model does not see: torch.compile, async TP.

    Rows that differ only there have the same setup to the model, so a grid keeps them apart
    rather than crediting or blaming the model's pick for a compiler flag.
    """
    notes = row.get("notes", "").lower()
    parts = []
    if "compile" in notes and "compile off" not in notes:
        parts.append("compile")
    if "async tp" in notes or "asynctp" in notes:
        parts.append("async-tp")
    return "+".join(parts) or "eager"


def map_row(row: Row) -> Case | Skip:
    """The row's inputs and measured value, or why it cannot be compared."""
    source, split = source_of(row), split_of(row["row_id"])
    try:
        if row.get("model_type", "dense").lower() == "moe":
            experts_of(row)  # skipped without the expert counts
        precision_of(row)  # a low-precision row is skipped before any model is built
        setup, notes = setup_of(row)
        measured, how = measured_of(row)
        hardware, hw_notes = build_hardware(row)
        model = build_model(row)
        check_consistent(row, model, measured, int(setup["seq_len"]))
    except _Skipped as exc:
        return Skip(row["row_id"], source, split, str(exc))
    grid = (source, row["model"], row["gpu"], row["n_gpus"], str(setup["seq_len"]),
            precision_group(row), software_group(row))  # fmt: skip
    return Case(row["row_id"], source, split, model, hardware, setup, measured, how, grid,
                notes + hw_notes)  # fmt: skip


Estimator = Callable[..., SpeedEstimate]


def predict(case: Case, estimator: Estimator | None = None) -> Case | Skip:
    """Call the speed model for the case's pinned setup; tokens/s per GPU into ``predicted``."""
    if estimator is None:
        from tools.planning.speed import estimate_speed

        estimator = estimate_speed
    kwargs = dict(case.setup)
    strategy = kwargs.pop("strategy")
    try:
        est = estimator(case.model, case.hardware, strategy, **kwargs)
    except InputError as exc:
        return Skip(case.row_id, case.source, case.split, f"speed model refused: {exc.field}")
    if not est.tokens_per_s:
        return Skip(case.row_id, case.source, case.split, "speed model gave no tokens/s")
    case.predicted = est.tokens_per_s / case.hardware.world_size
    return case


# --- the figures ------------------------------------------------------------------------------


def error_stats(cases: list[Case]) -> dict[str, Any]:
    """Median absolute error, worst ratio both ways, shares within 10/20%, count off by 2x."""
    if not cases:
        return {"n": 0}
    ratios = [c.ratio for c in cases]
    errors = [abs(r - 1) for r in ratios]
    return {
        "n": len(cases),
        "median_abs_error": statistics.median(errors),
        "worst_over": max(ratios),  # predicted / measured, the most optimistic row
        "worst_under": min(ratios),  # the most pessimistic
        "within_10pct": sum(e <= WITHIN[0] for e in errors) / len(errors),
        "within_20pct": sum(e <= WITHIN[1] for e in errors) / len(errors),
        "off_by_2x": sum(r >= 2 or r <= 0.5 for r in ratios),
    }


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties averaged."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson on average ranks); None when one side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


def _setup_key(case: Case) -> tuple[Any, ...]:
    return tuple(sorted(case.setup.items()))


def loose_grid(case: Case) -> tuple[str, ...]:
    """Same source, model, GPU and precision; the GPU count and sequence length may differ."""
    return case.grid[:3] + case.grid[5:]


def ranking(
    cases: list[Case], key: Callable[[Case], tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """Grids of one source, model, GPU, GPU count, sequence and precision, with >= 2 setups.

    Per grid: the measured throughput of the row the model predicts fastest over the best
    measured one, and Spearman's rank correlation of predicted vs measured. ``key`` groups
    otherwise (``loose_grid``: tokens/s per GPU across cluster sizes and sequence lengths).
    """
    grids: dict[tuple[str, ...], list[Case]] = defaultdict(list)
    for case in cases:
        grids[key(case) if key else case.grid].append(case)
    picks: list[float] = []
    rhos: list[float] = []
    by_source: dict[str, int] = Counter()
    for members in grids.values():
        if len({_setup_key(c) for c in members}) < 2:
            continue
        by_source[members[0].source] += 1
        pick = max(members, key=lambda c: c.predicted or 0.0)
        picks.append(pick.measured / max(c.measured for c in members))
        rho = spearman([c.predicted or 0.0 for c in members], [c.measured for c in members])
        if rho is not None:
            rhos.append(rho)
    return {
        "n_grids": len(picks),
        "grids_by_source": dict(by_source),
        "share_pick_within_5pct": (sum(p >= RANK_OK for p in picks) / len(picks))
        if picks
        else None,
        "median_pick_over_best": statistics.median(picks) if picks else None,
        "median_spearman": statistics.median(rhos) if rhos else None,
        "n_spearman": len(rhos),
    }


def gpu_family(case: Case) -> str:
    """The catalog GPU a case ran on (its datasheet name), for errors by GPU family."""
    gpu = case.hardware.gpu
    return gpu.name if gpu is not None else "cpu"


def evaluate(
    rows: Iterable[Row], split: str = "all", estimator: Estimator | None = None
) -> dict[str, Any]:
    """Map, predict and aggregate the rows of ``split``; per-row results under ``_cases``."""
    check_split(split)
    chosen = [r for r in rows if split == "all" or split_of(r["row_id"]) == split]
    done: list[Case] = []
    skipped: list[Skip] = []
    for row in chosen:
        mapped = map_row(row)
        if isinstance(mapped, Case):
            mapped = predict(mapped, estimator)
        (done if isinstance(mapped, Case) else skipped).append(mapped)  # type: ignore[arg-type]
    splits = ["fit", "held-out", "all"] if split == "all" else [split]
    sources = sorted({source_of(r) for r in chosen})
    groups: dict[str, dict[str, Any]] = {}
    ranks: dict[str, Any] = {}
    loose: dict[str, Any] = {}
    by_gpu: dict[str, dict[str, Any]] = {}
    for name in splits:
        in_split = [c for c in done if name == "all" or c.split == name]
        skip_split = [s for s in skipped if name == "all" or s.split == name]
        groups[name] = {}
        for source in [*sources, "all"]:
            cs = [c for c in in_split if source in ("all", c.source)]
            ss = [s for s in skip_split if source in ("all", s.source)]
            stats = error_stats(cs)
            stats["n_skipped"] = len(ss)
            stats["skip_reasons"] = dict(Counter(s.reason for s in ss).most_common())
            groups[name][source] = stats
        # The same rows by precision: 16-bit runs and fp8 linears (tools/planning/fp8.py).
        for label, wanted in (("16-bit", False), ("fp8", True)):
            cs = [c for c in in_split if (c.setup["precision"] == "fp8") == wanted]
            groups[name][label] = error_stats(cs) | {"n_skipped": 0, "skip_reasons": {}}
        by_gpu[name] = {
            gpu: error_stats([c for c in in_split if gpu_family(c) == gpu])
            for gpu in sorted({gpu_family(c) for c in in_split})
        }
        ranks[name] = ranking(in_split)
        loose[name] = ranking(in_split, loose_grid)
    return {
        "what": (
            "tools.planning.speed.estimate_speed for each published row's own setup (pinned) vs "
            "its measured tokens/s per GPU; aggregates only, no published value stored"
        ),
        "split_rule": f"fit when int(sha256(row_id), 16) % {FIT_MODULUS} == 0, else held-out",
        "split": split,
        "rows": len(chosen),
        "measured_from": dict(Counter(c.measured_how for c in done).most_common()),
        "errors": groups,
        "errors_by_gpu": by_gpu,
        "ranking": ranks,
        "ranking_loose": loose,
        "_cases": done,
        "_skipped": skipped,
    }


def aggregates(result: dict[str, Any]) -> dict[str, Any]:
    """The result without per-row data (what ``--json`` and bench/run.py store)."""
    return {k: v for k, v in result.items() if not k.startswith("_")}


def measure(folder: Path | None = None, split: str = "all") -> dict[str, Any]:
    """bench/run.py's ``published`` section: aggregates, or why it was skipped."""
    folder = folder or published_dir()
    if not folder.is_dir():
        return {"skipped": f"no published folder at {folder} (set {ENV_VAR}=DIR)"}
    out = aggregates(evaluate(read_rows(folder), split))
    out["folder"] = str(folder)
    return out


# --- output -----------------------------------------------------------------------------------


def _p(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render(result: dict[str, Any], worst: int = 10) -> str:
    """The stdout table: per split and source, the ranking figure, the worst rows by id."""
    lines = [
        f"published rows: {result['rows']} (split {result['split']}; {result['split_rule']})",
        "",
        f"{'split':<9} {'source':<12} {'used':>4} {'skip':>4} {'med|err|':>8} {'<=10%':>6} "
        f"{'<=20%':>6} {'>=2x':>4} {'worst over':>10} {'worst under':>11}",
    ]
    for split, by_source in result["errors"].items():
        for source, s in by_source.items():
            lines.append(
                f"{split:<9} {source:<12} {s['n']:>4} {s['n_skipped']:>4} "
                f"{_p(s.get('median_abs_error')):>8} {_p(s.get('within_10pct')):>6} "
                f"{_p(s.get('within_20pct')):>6} {s.get('off_by_2x', 0):>4} "
                f"{_r(s.get('worst_over')):>10} {_r(s.get('worst_under')):>11}"
            )
    lines += [
        "",
        f"{'split':<9} {'GPU':<32} {'used':>4} {'med|err|':>8} {'<=20%':>6} "
        f"{'worst over':>10} {'worst under':>11}",
    ]
    for split, by_gpu in result.get("errors_by_gpu", {}).items():
        for gpu, s in by_gpu.items():
            lines.append(
                f"{split:<9} {gpu[:32]:<32} {s['n']:>4} {_p(s.get('median_abs_error')):>8} "
                f"{_p(s.get('within_20pct')):>6} {_r(s.get('worst_over')):>10} "
                f"{_r(s.get('worst_under')):>11}"
            )
    lines += ["", "skipped rows by reason (all splits):"]
    top = result["errors"][next(reversed(result["errors"]))]["all"]["skip_reasons"]
    lines.insert(
        3, "(16-bit and fp8: the used rows of all sources by precision; skips are under all)"
    )
    lines += [f"  {n:>4}  {reason}" for reason, n in top.items()] or ["  none"]
    lines += ["", "ranking within grids (same source, model, GPU, count, seq, precision):"]
    lines += _rank_lines(result["ranking"])
    lines += ["", "loose grids (same source, model, GPU, precision; GPU count and seq vary):"]
    lines += _rank_lines(result["ranking_loose"])
    cases: list[Case] = result.get("_cases", [])
    if cases and worst:
        lines += [
            "",
            f"worst {min(worst, len(cases))} rows (predicted / measured tokens/s per GPU):",
        ]
        for c in sorted(cases, key=lambda c: -abs(math.log(c.ratio)))[:worst]:
            lines.append(f"  {c.row_id}  {c.ratio:.2f}x  ({c.split}, {c.source})")
    return "\n".join(lines)


def _rank_lines(ranks: dict[str, Any]) -> list[str]:
    lines = []
    for split, r in ranks.items():
        lines.append(
            f"  {split:<9} grids {r['n_grids']:>3}  pick >= 95% of best measured: "
            f"{_p(r['share_pick_within_5pct'])}  median pick/best "
            f"{_r(r['median_pick_over_best'])}  median Spearman "
            + ("-" if r["median_spearman"] is None else f"{r['median_spearman']:+.2f}")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run on the published folder; print the table, optionally write the aggregates."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="all", help="fit, held-out or all (default)")
    parser.add_argument("--json", type=Path, help="write the aggregates (no per-row values)")
    parser.add_argument("--worst", type=int, default=10, help="worst rows to list by row_id")
    parser.add_argument(
        "--folder",
        type=Path,
        help=f"the published folder (default ${ENV_VAR} or ../shared/published); "
        f"the project's own rows: {EXTRA_DIR.relative_to(ROOT)}",
    )
    args = parser.parse_args(argv)
    from tools.core.settings import disable_telemetry

    disable_telemetry()
    try:
        check_split(args.split)
        folder = args.folder or published_dir()
        if not folder.is_dir():
            print(f"published: no folder at {folder} (set {ENV_VAR}=DIR or --folder); skipped")
            return 0
        result = evaluate(read_rows(folder), args.split)
    except InputError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    print(render(result, args.worst))
    if args.json:
        out = aggregates(result)
        out["folder"] = str(folder)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
