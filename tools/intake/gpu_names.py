"""GPU names in free text: which catalog part a name, memory and form factor mean, and what was assumed.

``resolve("A100", None, None)`` is the A100-80GB SXM part, and says that the words gave
neither 40 or 80 GB nor SXM or PCIe; ``other_gpu_re`` finds names of hardware the catalog
lacks (an A40, a Gaudi, an Ascend 910B, a TPU), which intake refuses instead of planning for
another machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tools.research.accelerators import unplannable_words
from tools.research.hardware import CatalogGPU, find_gpu, load_gpu_catalog

# GPU names the catalog resolves; a longer spelling first (rtx 4090 before 4090, a100 before
# a10, h200 before h20).
GPU_NAMES = (
    r"rtx[\s-]?4090|rtx[\s-]?3090|geforce[\s-]?rtx[\s-]?4090|geforce[\s-]?rtx[\s-]?3090|"
    r"rtx[\s-]?6000[\s-]?ada(?:[\s-]generation)?|rtx[\s-]?a6000|a6000|"
    r"a100|a800|h100|h200|h800|h20|b200|v100|a10g|a10|l40s|mi300x|mi250x|mi300|mi250|4090|3090|"
    r"t4|l4"
)
MEM = r"(\d{1,4})\s*g(?:i?b)?\b(?!\s*(?:ib|infiniband|roce|ethernet|nics?)\b)"
FORM = r"sxm\d?|pcie|nvl"
# Words that look like a GPU or accelerator the catalog does not have (A40, L40, RTX 5000,
# MI210, GH200; and knowledge/accelerators.yaml's Gaudi, Ascend, TPU, Trainium...).
_OTHER_GPUS = (
    r"rtx[\s-]?(?:a?\d{4}\w*)|gtx[\s-]?\d{3,4}\w*|quadro\w*|[ahlbv]\d{2,4}[a-z]?"
    r"|gh200|gb200|mi\d{2,3}[a-z]?|radeon\w*|arc\s?a\d{3}"
    # A letter O typed for a zero ("H1OO", "a1o0s"): refused with the name it looks like.
    r"|[ahbv]\d(?=[\do]*o)[\do]{1,3}s?"
)
_NAME_RE = re.compile(rf"(?:{GPU_NAMES})", re.I)


def zero_typo(name: str) -> str | None:
    """The catalog name ``name`` spells with a letter O for a zero ("H1OO" -> "H100"), or None."""
    fixed = re.sub(r"[oO]", "0", re.sub(r"s$", "", name.strip())).upper()
    return fixed if fixed != name.strip().upper() and _NAME_RE.fullmatch(fixed) else None


@lru_cache(maxsize=1)
def other_gpu_re() -> re.Pattern[str]:
    """Names of GPUs and accelerators the catalog lacks, as one word pattern."""
    return re.compile(rf"\b(?:{unplannable_words()}|{_OTHER_GPUS})\b", re.I)


@dataclass(frozen=True)
class Resolved:
    """The catalog part words name, why none (``why_not``), or what the words left open."""

    gpu: CatalogGPU | None
    why_not: str | None = None
    assumed: str | None = None  # "assumed A100-80GB: the request does not say 40 or 80 GB"


def family(name: str) -> list[CatalogGPU]:
    """The catalog parts that share a name's family (A100: the 40/80 GB SXM and PCIe parts)."""
    default = find_gpu(re.sub(r"^geforce[\s-]?", "", name, flags=re.I))
    prefix = default.id.split("-")[0]
    parts = [g for g in load_gpu_catalog().values() if g.id.split("-")[0] == prefix]
    return sorted(parts, key=lambda g: g.id != default.id)  # the default part first


# Names the catalog plans as a near part (its alias), with what that changes, for the
# assumption line: the MI250 is a cut-down MI250X (AMD Instinct MI250 and MI250X datasheets).
_NEAR_PARTS = {
    "MI250": (
        "assumed MI250X: the catalog has no MI250, a cut-down MI250X (208 compute units to 220, "
        "362 vs 383 TFLOP/s bf16, the same 128 GB), so the plan's speeds are about 6% high"
    ),
    "MI300": "assumed MI300X: 'MI300' also names the MI300A APU, which the catalog lacks",
}


def _catalog_id_written(written: str) -> bool:
    """Whether the words are a catalog id itself ("A100-40GB", "H100-80GB"): nothing left open."""
    return written.strip().lower() in {gpu_id.lower() for gpu_id in load_gpu_catalog()}


def resolve(name: str, memory: int | None, form: str | None, written: str = "") -> Resolved:
    """The catalog part for a name, memory and form factor; or why not; and what was assumed.

    Words that leave the memory or the form factor open take the name's default part (the
    catalog alias: a plain "A100" is the 80 GB SXM part, a plain "V100" the 16 GB one), and
    ``assumed`` says so, unless they are the catalog id itself (``written``: "A100-40GB").
    """
    parts = members = family(name)
    label = re.sub(r"\s+", " ", name.upper())
    if memory is not None:
        parts = [g for g in parts if round(g.memory_gb) == memory]
        if not parts:
            sizes = sorted({f"{g.memory_gb:g}" for g in members})
            return Resolved(
                None,
                f"{label} {memory}GB is not a part the GPU catalog knows ({label}: {'/'.join(sizes)} GB)",
            )
    if form == "nvl":
        return Resolved(None, f"{label} NVL is not in the GPU catalog")
    if form == "pcie":
        parts = [g for g in parts if g.link == "pcie"]
        if not parts:
            return Resolved(None, f"{label} PCIe is not in the GPU catalog")
    open_forms = form is None and len({g.link == "pcie" for g in parts}) > 1
    if form is None or form.startswith("sxm"):
        parts = [g for g in parts if g.link != "pcie"] or parts  # no form given: the SXM part
    gpu = parts[0]
    left_open = []
    memories = sorted({g.memory_gb for g in members})
    if memory is None and len(memories) > 1:
        left_open.append(f"{' or '.join(f'{m:g}' for m in memories)} GB")
    if open_forms:
        left_open.append("SXM or PCIe")
    assumed = None
    if left_open and not _catalog_id_written(written):
        assumed = (
            f"assumed {gpu.id}: the request does not say {', nor '.join(left_open)} "
            f"(the catalog's part for a plain {label!r})"
        )
    assumed = _NEAR_PARTS.get(re.sub(r"[\s-]", "", label), assumed)
    return Resolved(gpu, assumed=assumed)
