"""Read the hardware a free-text request names: counts, GPU type, memory, form factor, nodes, RAM, NICs.

``read_hardware("four 40GB A100s")`` -> one node of 4 A100-40GB. Counts may be digits, English
words ("a single", "a pair of", "a dozen") or Chinese ("4 张", "两台 8 卡"); a memory size may
stand before or after the GPU name, with or without a space ("A100 40GB", "A100-40GB", "40GB
A100s"); a form factor (SXM, PCIe, NVL) picks the catalog part. A GPU count with no node count
is split into nodes of 8 (the HGX/DGX/OAM platform size) when it is larger than 8, and the
reading says it assumed so. Host RAM ("512 GB RAM per node") and NICs ("8x400G IB", "25GbE",
"4x200Gb RoCE") are read when stated.

What the text names but this reader cannot resolve (two GPU types, a count with no type, a
count that splits into no whole nodes) is listed in ``unclear``: intake asks about it instead
of planning for some other machine. Hardware no plan can target (a GPU type the catalog lacks,
a Gaudi, an Ascend NPU, a TPU: ``unknown``) is refused in one line that lists the types it can
plan for. A name that leaves the part open ("8 A100s": 40 or 80 GB, SXM or PCIe) takes the
catalog's default part, and ``assumed`` says so, with the words it was read from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tools.intake.count_words import normalise as _normalise
from tools.intake.gpu_names import FORM as _FORM
from tools.intake.gpu_names import GPU_NAMES as _GPU_NAMES
from tools.intake.gpu_names import MEM as _MEM
from tools.intake.gpu_names import other_gpu_re, resolve, zero_typo
from tools.intake.instance_names import rewrite as instance_phrases
from tools.intake.readings import Assumed
from tools.research.accelerators import plannable_types, why_not
from tools.research.hardware import MAX_GPUS_PER_NODE, load_gpu_catalog

# GPUs per node on the 8-GPU baseboards (NVIDIA HGX/DGX, AMD's OAM platform): what "64 V100"
# or "16 MI300X" means when no node count is given.
PLATFORM_GPUS_PER_NODE = 8

# One GPU mention: [count] [memory] [form] NAME [-memory] [form] [memory] [s].
_MENTION_RE = re.compile(
    r"(?:(?<![\d.])(?P<count>\d{1,6})\s*(?:[x×*]\s*|gpus?\s+(?:of\s+)?|cards?\s+(?:of\s+)?)?)?"
    r"(?:(?P<pre_mem>\d{1,4})\s*gi?b\s+)?(?:(?P<pre_form>" + _FORM + r")\s+)?"
    r"(?:nvidia\s+|amd\s+|tesla\s+|instinct\s+)?"
    r"\b(?P<name>" + _GPU_NAMES + r")"
    r"(?P<suffix>(?:[\s-]*(?:" + _MEM + r"|(?:" + _FORM + r")\b|hbm\d?e?\b))*)"
    r"(?:s|es)?(?![a-z0-9])(?:\s*[x×*]\s*(?P<post_count>\d{1,6})(?![\d.]))?",
    re.I,
)
_SUFFIX_MEM_RE = re.compile(_MEM.replace("(\\d", "(?P<mem>\\d", 1), re.I)
_SUFFIX_FORM_RE = re.compile(r"\b(" + _FORM + r")\b", re.I)
# "2 nodes", "a 2-node cluster", "32 servers", "两台" (after the Chinese is rewritten), "2 DGX".
_NODE_WORDS = r"(?:nodes?|servers?|machines?|hosts?|boxes|instances?|dgxs?|hgxs?)"
_NODES_RE = re.compile(r"(?<![\d.])(\d{1,6})\s*(?:x\s*|-)?" + _NODE_WORDS + r"\b", re.I)
_DGX_RE = re.compile(r"\b(?:dgx|hgx)\b", re.I)
# The GPU count is per node: "... H100 per node", "8 H100 each", "8 GPUs per node".
_PER_NODE_AFTER_RE = re.compile(
    r"^\s*(?:gpus?\s*)?(?:per|each|/|a)\s*(?:node|server|machine|host)\b|^\s*each\b", re.I
)
# The count after "each node" / "每台": "2 nodes, each with 8 H100", "两台机器，每台 8 张 H100".
_PER_NODE_BEFORE_RE = re.compile(
    r"(?:每\s*(?:台|个?\s*节\s*点|机\s*器?|个?\s*服\s*务\s*器)|\beach\s+(?:node|server|machine|host)"
    r"(?:\s+(?:has|with|having))?|\beach\s+(?:has|with|having|of\s+them\s+(?:has|with))|"
    r"\bper\s+(?:node|server|machine|host))\s*[:：,，]?\s*$",
    re.I,
)
# "8 GPUs per node" anywhere: checked against a total split over a node count.
_PER_NODE_COUNT_RE = re.compile(
    r"(?<![\d.])(\d{1,6})\s*(?:gpus?|cards?)\s*(?:per|each|/|a)\s*(?:node|server|machine|host)\b",
    re.I,
)
# "2x8xH100": nodes x GPUs x type, the brief's own spelling; also "4x8 H100" and "4 x 8 H100"
# (nodes x GPUs, then the name after a space).
# A cluster spec as briefs carry it, NODESxGPUSxTYPE (or GPUSxTYPE); the pattern below finds
# one written in a request's text.
SPEC_RE = re.compile(r"^\s*(?:(\d+)x)?(\d+)x(.+?)\s*$", re.I)
_SPEC_RE = re.compile(r"(?<![\d.])(\d{1,6})\s*[x×]\s*(\d{1,6})\s*(?:[x×]\s*|\s+)(?=[a-z])", re.I)
_GPU_COUNT_ONLY_RE = re.compile(
    r"(?<![\d.])(\d{1,6})\s*(?:x\s*)?(?:gpus?|cards?|accelerators?)\b", re.I
)
_HARDWARE_WORDS_RE = re.compile(
    r"\b(?:gpus?|cards?|nodes?|clusters?|accelerators?|servers?|dgx|hgx|cuda)\b", re.I
)
_LOCAL_RE = re.compile(
    r"\b(?:on\s+)?(?:this|my|our|the\s+local)\s+(?:own\s+)?(?:machine|computer|laptop|desktop|"
    r"workstation|box|pc|mac(?:book)?|cpu)\b|\bon\s+(?:the\s+)?cpus?\b|\blocally\b|\blocal\s+(?:machine|box|cpu)\b|\bhere\b|"
    r"本机|本地|这台(?:机器|电脑)|我的(?:电脑|笔记本)",
    re.I,
)
_RAM_RE = re.compile(
    r"(?<![\d.])(\d{1,5}(?:\.\d+)?)\s*(tb|tib|gb|gib|g)\s*(?:of\s+)?(?:host\s+|cpu\s+|system\s+|ddr\d\s+)?"
    r"(?:ram|dram|memory\s+per\s+node|host\s+memory|内存)",
    re.I,
)
_RAM_AFTER_RE = re.compile(
    r"(?:ram|内存)\s*[:=]?\s*(\d{1,5}(?:\.\d+)?)\s*(tb|tib|gb|gib|g)\b", re.I
)
_NET_WORD = r"(ib|infiniband|roce(?:v2)?|ethernet|eth|gbe|nics?|efa)"
# "8x400G IB", "4 x 200Gb RoCE", "8x 400Gbps NICs"; then one link: "400G IB", "25GbE".
_NICS_RE = re.compile(
    r"(?<![\d.])(\d{1,2})\s*[x×]\s*(\d{1,4})\s*(?:g|gb|gbit|gbps|gb/s|gbe)?\s*"
    + _NET_WORD
    + r"?\b",
    re.I,
)
_NIC_RE = re.compile(
    r"(?<![\d.x×])(\d{1,4})\s*(?:g|gb|gbit|gbps|gb/s)?\s*"
    + _NET_WORD
    + r"\b|(?<![\d.x×])(\d{1,4})\s*gbe\b",
    re.I,
)
# The fabric first, then the rate: "InfiniBand 200Gb", "IB 400G", "RoCE at 100Gbps".
NIC_AFTER_RE = re.compile(
    r"\b(ib|infiniband|roce(?:v2)?|ethernet|eth)\s*(?:at\s+|of\s+)?(\d{1,4})\s*"
    r"(?:g|gb|gbit|gbps|gb/s)\b",
    re.I,
)
_NET_NAMES_RE = re.compile(r"\b(ndr|hdr|infiniband|roce)\b", re.I)


@dataclass
class HardwareReading:
    """What a request says about the hardware; ``spec`` is the brief's hardware string."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None  # catalog id, e.g. A100-40GB
    memory_gb: float | None = None
    form_factor: str | None = None  # sxm | pcie | nvl
    host_ram_gb: float | None = None
    nics_per_node: int | None = None
    nic_gbps: float | None = None
    interconnect: str | None = None
    local: bool = False
    mentioned: bool = False  # the text names hardware of some kind
    text: str = ""  # the phrase that was read (the quote its facts came from)
    assumed: list[Assumed] = field(default_factory=list)  # what the words left open, and why
    unclear: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # hardware named that no plan can target

    @property
    def spec(self) -> str | None:
        """``NODESxGPUSxTYPE``, ``local``, or None when nothing usable was read."""
        if self.unclear:
            return None
        if self.gpu and self.nodes and self.gpus_per_node:
            return f"{self.nodes}x{self.gpus_per_node}x{self.gpu}"
        return "local" if self.local or not self.mentioned else None

    def said(self) -> str:
        """What was read, for a question: ``1 node(s) x 4 A100-80GB``; empty when nothing was."""
        parts = []
        if self.gpu:
            count = (
                f"{self.nodes} node(s) x {self.gpus_per_node} "
                if self.nodes and self.gpus_per_node
                else ""
            )
            parts.append(f"{count}{self.gpu}")
        if self.host_ram_gb:
            parts.append(f"{self.host_ram_gb:g} GB host RAM per node")
        if self.nic_gbps:
            parts.append(f"{self.nics_per_node or 1} x {self.nic_gbps:g} Gb/s NIC(s) per node")
        return ", ".join(parts)


# A price or a budget in GPU-hours ("$2.50/GPU-hour", "3 USD per GPU hour", "2,000 GPU-hrs")
# names no hardware: blanked (same length, so positions hold) before anything is read.
_GPU_HOUR_RE = re.compile(r"\bgpu[\s-]*(?:hours?|hrs?|h)\b", re.I)


def read_hardware(text: str) -> HardwareReading:
    """Read the hardware phrases of a request (see the module docstring)."""
    # A cloud instance type ("AWS p4d.24xlarge x 4") becomes the nodes and GPUs it stands for.
    phrased, instances = instance_phrases(text)
    norm = _GPU_HOUR_RE.sub(lambda m: " " * len(m.group(0)), _normalise(phrased))
    reading = HardwareReading()
    reading.local = bool(_LOCAL_RE.search(text))
    read_host(norm, reading)

    mentions = [m for m in _MENTION_RE.finditer(norm) if not _inside_model_name(norm, m)]
    names: dict[str, re.Match[str]] = {}
    variants: dict[str, str] = {}
    for m in mentions:
        resolved = resolve(m["name"], *_mem_form(m), written=m["name"] + (m["suffix"] or ""))
        if resolved.why_not:
            reading.unclear.append(resolved.why_not)
            reading.unknown.append(m.group(0).strip())
        elif resolved.gpu is not None:
            first = names.setdefault(resolved.gpu.id, m)
            if not (first["count"] or first["post_count"]) and (m["count"] or m["post_count"]):
                names[resolved.gpu.id] = m  # "A10Gs ... 8 A10G": the counted mention says how many
            if resolved.assumed:
                variants.setdefault(resolved.gpu.id, resolved.assumed)
    covered = [range(m.start("name"), m.end()) for m in mentions]
    others = list(
        dict.fromkeys(
            _shown_name(o.group(0))
            for o in other_gpu_re().finditer(norm)
            if not any(o.start() in span for span in covered) and not _inside_model_name(norm, o)
        )
    )
    reading.mentioned = bool(
        mentions or others or _HARDWARE_WORDS_RE.search(norm) or re.search(r"显卡|集群|节点", text)
    )
    if others:
        reading.unknown += others
        plain = [o for o in others if why_not(o).endswith("not in the GPU catalog")]
        if plain:
            reading.unclear.append(
                f"{', '.join(plain)} {'is' if len(plain) == 1 else 'are'} not in the GPU catalog"
            )
        reading.unclear += [why_not(o) for o in others if o not in plain]
        reading.unclear += [
            f"did you mean {meant}? ('{o}' has a letter O for a zero)"
            for o in plain
            if (meant := zero_typo(o))
        ]
    if len(names) > 1:
        reading.unclear.append(f"names several GPU types ({', '.join(names)}); plan for which?")
    if not names:
        if reading.mentioned and not reading.local and not reading.unclear:
            count = _GPU_COUNT_ONLY_RE.search(norm)
            word = _HARDWARE_WORDS_RE.search(norm)
            reading.unclear.append(
                f"{count.group(0)} without a GPU type"
                if count
                else f"'{word.group(0) if word else 'hardware'}' named, but no GPU type or count"
            )
        return reading
    gpu_id, m = next(iter(names.items()))
    reading.gpu, reading.text = gpu_id, m.group(0).strip()
    gpu = load_gpu_catalog()[gpu_id]
    reading.memory_gb = gpu.memory_gb
    reading.form_factor = "pcie" if gpu.link == "pcie" else "sxm"
    reading.local = False
    if gpu_id in variants:
        reading.assumed.append(Assumed("hardware", gpu_id, variants[gpu_id], reading.text))
    _read_counts(norm, m, reading)
    shape = f"{reading.nodes}x{reading.gpus_per_node}x{gpu_id}"
    reading.assumed += [Assumed("hardware", shape, line, words) for line, words in instances]
    return reading


def _shown_name(name: str) -> str:
    """A matched name as the user wrote it: no plural ("A40s", "TPUs"), CJK unspaced."""
    name = re.sub(r"(?<=[\u4e00-\u9fff])\s+(?=[\u4e00-\u9fff])", "", name.strip())
    name = re.sub(r"(?<=\d)s$|(?<=[A-Z])s$", "", re.sub(r"\s+", " ", name))
    return name


def _inside_model_name(text: str, m: re.Match[str]) -> bool:
    """A match inside a model name ("t5-xl", "qwen2-vl"), not a GPU: glued to a letter."""
    start = m.start("name") if "name" in m.re.groupindex else m.start()
    return start > 0 and (text[start - 1].isalpha() or text[start - 1] in "-_.")


def _mem_form(m: re.Match[str]) -> tuple[int | None, str | None]:
    suffix = m["suffix"] or ""
    mem = m["pre_mem"] or (s.group("mem") if (s := _SUFFIX_MEM_RE.search(suffix)) else None)
    form = m["pre_form"] or (f.group(1) if (f := _SUFFIX_FORM_RE.search(suffix)) else None)
    return (int(mem) if mem else None), (form.lower() if form else None)


def _read_counts(norm: str, m: re.Match[str], reading: HardwareReading) -> None:
    """Nodes and GPUs per node from the mention's count, a node count and the platform size."""
    before = norm[: m.start()]
    count = int(m["count"] or m["post_count"]) if (m["count"] or m["post_count"]) else None
    for spec in _SPEC_RE.finditer(norm):
        if spec.end() == m.start("name"):
            reading.nodes, reading.gpus_per_node = int(spec[1]), int(spec[2])
            return _check_counts(reading)
    node_match = None
    for node_match in _NODES_RE.finditer(norm):
        if not (m.start() <= node_match.start() < m.end()):
            break
    nodes = int(node_match[1]) if node_match else None
    dgx = _DGX_RE.search(norm) is not None
    if nodes is None and dgx and count is None:
        nodes = 1
    per_node_word = bool(
        _PER_NODE_AFTER_RE.search(norm[m.end() :]) or _PER_NODE_BEFORE_RE.search(before)
    )
    # "32 nodes of 8 H100", "两台 8 卡": the count follows the node phrase directly.
    follows_nodes = bool(
        node_match
        and node_match.end() <= m.start()
        and re.fullmatch(
            r"\s*(?:of|with|each\s+with|x|×|,|:|each)?\s*(?:\d+\s*gpus?\s*(?:of\s*)?)?",
            before[node_match.end() :] + "",
        )
        is not None
    )
    if count is None:
        gpus = _GPU_COUNT_ONLY_RE.search(norm)
        count = int(gpus[1]) if gpus else None
    if count is None:
        if nodes is not None and dgx:
            reading.nodes, reading.gpus_per_node = nodes, PLATFORM_GPUS_PER_NODE
            _assume(reading, f"{PLATFORM_GPUS_PER_NODE} {reading.gpu} per DGX/HGX node assumed")
        else:
            reading.nodes, reading.gpus_per_node = nodes or 1, 1
            plural = re.search(r"(?:s|es)$", m.group(0).strip(), re.I) and not m["suffix"]
            if nodes is None and plural:
                reading.unclear.append(f"{m.group(0).strip()} without a count")
            elif nodes is None:
                _assume(reading, f"no GPU count given: one {reading.gpu} assumed")
            else:
                reading.unclear.append(
                    f"{nodes} node(s) of {reading.gpu}, but not how many per node"
                )
        return _check_counts(reading)
    if nodes is not None and (per_node_word or follows_nodes or dgx):
        reading.nodes, reading.gpus_per_node = nodes, count
    elif nodes is not None:
        if count % nodes:
            reading.unclear.append(f"{count} {reading.gpu} do not split evenly over {nodes} nodes")
            return None
        stated = _PER_NODE_COUNT_RE.search(norm)
        if stated and int(stated[1]) != count // nodes:  # "8 A100 with 8 GPUs per node and 2 nodes"
            reading.unclear.append(
                f"{count} {reading.gpu} over {nodes} nodes is {count // nodes} per node, but "
                f"'{stated[0].strip()}' says {stated[1]}"
            )
            return None
        reading.nodes, reading.gpus_per_node = nodes, count // nodes
    elif per_node_word:
        reading.nodes, reading.gpus_per_node = 1, count
    elif count > PLATFORM_GPUS_PER_NODE:
        if count % PLATFORM_GPUS_PER_NODE:
            reading.unclear.append(
                f"{count} {reading.gpu} is more than one {PLATFORM_GPUS_PER_NODE}-GPU node and "
                f"not whole nodes of {PLATFORM_GPUS_PER_NODE}; say how many nodes"
            )
            return None
        reading.nodes, reading.gpus_per_node = (
            count // PLATFORM_GPUS_PER_NODE,
            PLATFORM_GPUS_PER_NODE,
        )
        _assume(
            reading,
            f"{PLATFORM_GPUS_PER_NODE} GPUs per node assumed (the HGX/DGX/OAM platform), "
            f"{reading.nodes} nodes; say 'N nodes of M' otherwise",
        )
    else:
        reading.nodes, reading.gpus_per_node = 1, count
    return _check_counts(reading)


def _assume(reading: HardwareReading, why: str) -> None:
    """Record a node-shape assumption (the nodes and GPUs per node just set)."""
    shape = f"{reading.nodes}x{reading.gpus_per_node}x{reading.gpu}"
    reading.assumed.append(Assumed("hardware", shape, why, reading.text))


def _check_counts(reading: HardwareReading) -> None:
    if not reading.nodes or not reading.gpus_per_node:
        reading.unclear.append(f"a count of 0 {reading.gpu}")
    elif reading.gpus_per_node > MAX_GPUS_PER_NODE:
        reading.unclear.append(
            f"{reading.gpus_per_node} {reading.gpu} in one node is more than {MAX_GPUS_PER_NODE}; "
            "say how many nodes"
        )


def read_host(norm: str, reading: HardwareReading) -> None:
    """Host RAM and NICs per node."""
    if m := (_RAM_RE.search(norm) or _RAM_AFTER_RE.search(norm)):
        scale = 1024 if m.group(2).lower().startswith("t") else 1
        reading.host_ram_gb = float(m.group(1)) * scale
    net = None
    if m := _NICS_RE.search(norm):
        if m.group(3) or re.search(
            r"g(?:b|bit|bps|b/s|be)?\s*$", norm[m.start(2) : m.end(2) + 4], re.I
        ):
            reading.nics_per_node, reading.nic_gbps, net = (
                int(m.group(1)),
                float(m.group(2)),
                m.group(3),
            )
    if reading.nic_gbps is None and (m := _NIC_RE.search(norm)):
        if m.group(3):
            reading.nics_per_node, reading.nic_gbps, net = 1, float(m.group(3)), "gbe"
        else:
            reading.nics_per_node, reading.nic_gbps, net = 1, float(m.group(1)), m.group(2)
    if reading.nic_gbps is None and (m := NIC_AFTER_RE.search(norm)):
        reading.nics_per_node, reading.nic_gbps, net = 1, float(m.group(2)), m.group(1)
    word = (net or "").lower()
    if not word and (n := _NET_NAMES_RE.search(norm)):
        word = n.group(1).lower()
        if word in ("ndr", "hdr"):
            reading.interconnect = "ib400" if word == "ndr" else "ib200"
            return
    gbps = reading.nic_gbps
    if word in ("ib", "infiniband") and gbps in (400.0, 200.0):
        reading.interconnect = f"ib{int(gbps)}"
    elif word.startswith("roce") and gbps == 100.0:
        reading.interconnect = "roce100"
    elif word in ("gbe", "ethernet", "eth") and gbps == 25.0:
        reading.interconnect = "eth25"


# Request-field keys (not brief fields) that carry a reading's doubts and assumptions from
# ``request_fields`` to intake: removed before the fields are validated as a brief.
HARDWARE_UNCLEAR = "_hardware_unclear"
HARDWARE_ASSUMED = "_hardware_assumed"
# Set with HARDWARE_UNCLEAR when the text names hardware no plan can target (a GPU the catalog
# lacks, a Gaudi, an Ascend, a TPU): intake refuses it in one line instead of asking.
HARDWARE_REFUSED = "_hardware_refused"


def hardware_fields(text: str) -> dict[str, Any]:
    """The brief fields a request's hardware phrases state, and what was unclear or assumed.

    ``hardware`` is set when the text names readable GPUs, or ``local`` when it says this
    machine; nothing when it names no hardware (the brief's default, ``local``). When the
    text names hardware this reader cannot resolve, ``HARDWARE_UNCLEAR`` holds one line saying
    what it read and what was unclear, and no ``hardware`` is set.
    """
    reading = read_hardware(text)
    data: dict[str, Any] = {}
    if reading.unclear:
        said = f"read {reading.said()}; " if reading.said() else ""
        data[HARDWARE_UNCLEAR] = f"{said}unclear: {'; '.join(reading.unclear)}"
        if reading.unknown:  # hardware no plan can target: refused, never another machine
            data[HARDWARE_REFUSED] = (
                f"{said}{'; '.join(reading.unclear)}; trainwright plans for {plannable_types()}"
            )
    elif reading.spec is not None and (reading.gpu or reading.local):
        data["hardware"] = reading.spec
    if reading.assumed and not reading.unclear:
        data[HARDWARE_ASSUMED] = [
            f"intake: hardware {reading.text!r} read as {reading.spec}: {a.why}"
            for a in reading.assumed
        ]
    if reading.host_ram_gb is not None:
        data["host_ram_gb"] = reading.host_ram_gb
    if reading.nics_per_node is not None and reading.nic_gbps is not None:
        data["nics_per_node"], data["nic_gbps"] = reading.nics_per_node, reading.nic_gbps
    if reading.interconnect is not None and (reading.nodes or 0) > 1:
        data["interconnect"] = reading.interconnect  # the network between nodes
    return data


def spec_assumed(spec: str) -> list[str]:
    """What a NODESxGPUSxTYPE spec leaves open and the part it took ("8xH100": SXM assumed).

    ``profile`` and ``estimate`` name these, as a request's account does.
    """
    return [a.why for a in read_hardware(spec).assumed if a.why.startswith("assumed ")]
