"""GPU-hour prices: the cited list-price table, and which price a plan uses.

The figures live in ``knowledge/gpu_prices.yaml`` (on-demand list prices with their provider,
page and month; they change), keyed by the GPU catalog id of ``knowledge/gpus.yaml``. A brief's
``price_per_gpu_hour`` (also what a request's words set, tools/intake/budget_text.py) always
wins over the table; ``plan_price`` says which one a plan used and where it came from.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tools.core.errors import InputError
from tools.core.schemas import GPUSpec, TrainingBrief
from tools.research.hardware import CatalogGPU, find_gpu, load_gpu_catalog


class ListPrice(BaseModel):
    """One GPU's on-demand list price per GPU-hour, with where it was read."""

    model_config = ConfigDict(extra="forbid")

    gpu: str
    usd_per_gpu_hour: float = Field(gt=0, le=1000)
    provider: str = Field(min_length=1)
    offer: str = Field(min_length=1)
    listed: str = Field(pattern=r"^[A-Z][a-z]+ \d{4}$")
    source: str = Field(min_length=10)


class PlanPrice(BaseModel):
    """The price per GPU-hour a plan's cost uses, and where it came from."""

    price_per_gpu_hour: float
    currency: str | None = None  # None: the brief's own currency, which the brief does not name
    source: str


@lru_cache(maxsize=1)
def load_price_table() -> dict[str, ListPrice]:
    """The list prices of ``knowledge/gpu_prices.yaml``, keyed by GPU catalog id.

    Raises:
        RuntimeError: When an entry names a GPU the catalog does not have (a data bug).
    """
    text = resources.files("knowledge").joinpath("gpu_prices.yaml").read_text(encoding="utf-8")
    raw: dict[str, dict[str, Any]] = yaml.safe_load(text)
    catalog = load_gpu_catalog()
    table = {}
    for gpu_id, fields in raw.items():
        if gpu_id not in catalog:
            raise RuntimeError(f"gpu_prices.yaml: {gpu_id!r} is not a GPU of gpus.yaml")
        table[gpu_id] = ListPrice(gpu=gpu_id, **fields)
    return table


def list_price(gpu: GPUSpec | None) -> ListPrice | None:
    """The table's price of ``gpu`` (a catalog GPU, or one a machine reports), None if unlisted."""
    if gpu is None:
        return None
    gpu_id = gpu.id if isinstance(gpu, CatalogGPU) else None
    if gpu_id is None:
        try:
            gpu_id = find_gpu(gpu.name).id
        except InputError:
            return None
    return load_price_table().get(gpu_id)


def plan_price(brief: TrainingBrief, gpu: GPUSpec | None) -> PlanPrice | None:
    """The brief's price when it gives one, else the table's for ``gpu`` (None: neither)."""
    if brief.price_per_gpu_hour is not None:
        return PlanPrice(
            price_per_gpu_hour=brief.price_per_gpu_hour,
            source="the brief's price_per_gpu_hour, or the request's words",
        )
    listed = list_price(gpu)
    if listed is None:
        return None
    return PlanPrice(
        price_per_gpu_hour=listed.usd_per_gpu_hour,
        currency="USD",
        source=f"{listed.provider} {listed.offer}, list price as listed {listed.listed} in "
        "knowledge/gpu_prices.yaml; list prices change",
    )
