"""The weights a model name loads when it names a variant of a catalog model.

The catalog prices an architecture: ``Llama-3-8B-Instruct`` and ``meta-llama/Meta-Llama-3-8B``
are one shape, so the instruct name is an alias of ``llama-3-8b``. The weights are not one:
a fine-tune of the instruct model must load ``meta-llama/Meta-Llama-3-8B-Instruct``, never the
catalog entry's own ``hf_repo`` (the base model). ``variant_weights`` gives the hub id a name
stands for when it is not the entry's own weights, read from the catalog's aliases:

- a hub id alias (``org/name``) other than the entry's ``hf_repo``: that id;
- a bare alias (``Llama-3-8B-Instruct``): the entry's one hub id alias that ends with it
  (``meta-llama/Meta-Llama-3-8B-Instruct``), punctuation and case aside.

A bare alias no hub id alias ends with names no weights here (None: the caller says which
weights the launch loads instead).
"""

from __future__ import annotations

import re

from tools.research.model_catalog import catalog_id, load_model_catalog


def _flat(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def variant_weights(name: object) -> str | None:
    """The hub id of the weights ``name`` names, where they are not its catalog entry's own."""
    if not isinstance(name, str) or (model_id := catalog_id(name)) is None:
        return None
    entry = load_model_catalog()[model_id]
    own = _flat(str(entry.get("hf_repo") or ""))
    hub_ids = [str(a) for a in entry.get("aliases", []) if "/" in str(a)]
    if "/" in name.strip():
        return name.strip() if _flat(name) != own else None
    flat = _flat(name)
    if not flat or flat == _flat(model_id) or own.endswith(flat):
        return None  # the catalog id, or a name of the entry's own weights
    ending = [a for a in hub_ids if _flat(a.rpartition("/")[2]).endswith(flat)]
    return ending[0] if len(ending) == 1 and _flat(ending[0]) != own else None
