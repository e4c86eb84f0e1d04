"""Validate a DeepSpeed config with DeepSpeed's own DeepSpeedConfig, at the target world size.

It also rejects what DeepSpeed would silently ignore: an ``"auto"`` value (only the Hugging
Face integration resolves those) and a top-level key DeepSpeed's parser never reads.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tools.artifacts.deepspeed_config import ConfigError
from tools.artifacts.ds_rules import check_written_form
from tools.core.imports import import_deepspeed_quietly


class _RecordingKeys:
    """``dict.keys()`` stand-in that records membership tests (``KEY in d.keys()``)."""

    def __init__(self, owner: _RecordingDict) -> None:
        self._owner = owner

    def __contains__(self, key: object) -> bool:
        self._owner.read.add(key)
        return dict.__contains__(self._owner, key)

    def __iter__(self) -> Iterator[Any]:
        return iter(dict.keys(self._owner))

    def __len__(self) -> int:
        return dict.__len__(self._owner)


class _RecordingDict(dict):  # type: ignore[type-arg]
    """A top-level config dict that remembers which keys DeepSpeed's parser looked up.

    DeepSpeedConfig ignores top-level keys it never reads (a typo like ``"zero_optimisation"``
    trains without ZeRO). Rather than copy DeepSpeed's key list, we let it tell us: every key
    it consults while parsing this very config is known; any other key present is not.
    ``copy.copy`` (which DeepSpeedConfig uses) keeps the subclass and shares ``read``.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.read: set[object] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def keys(self) -> _RecordingKeys:  # type: ignore[override]
        return _RecordingKeys(self)


class _DataParallelGroup:
    """The ``mpu`` hook DeepSpeedConfig asks for the data-parallel world size."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size

    def get_data_parallel_world_size(self) -> int:
        return self._world_size

    def get_sequence_parallel_world_size(self) -> int:
        return 1


class _RankZero:
    """Stands in for ``deepspeed.comm`` inside runtime/config.py: this process is rank 0."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size

    def get_rank(self, group: Any = None) -> int:
        return 0

    def get_world_size(self, group: Any = None) -> int:
        return self._world_size


_PATCH_LOCK = threading.Lock()


@contextmanager
def _as_rank_zero(config_module: Any, world_size: int) -> Iterator[None]:
    """Let DeepSpeedConfig see ``world_size`` without a process group.

    DeepSpeedConfig.__init__ calls ``dist.get_rank()`` first; without an initialised process
    group that raises, and it silently falls back to world size 1, so batch arithmetic would be
    checked for one GPU. The ``mpu`` argument carries the data-parallel size but is only
    consulted after ``get_rank()`` succeeds, so we swap runtime/config.py's module-level
    ``dist`` (only that module's name; deepspeed.comm itself is untouched) for a rank-0 stub.
    """
    with _PATCH_LOCK:
        original = config_module.dist
        config_module.dist = _RankZero(world_size)
        try:
            yield
        finally:
            config_module.dist = original


def scheduler_probe() -> Any:
    """A ``torch.optim.Optimizer`` with one parameter group at lr 0, for a scheduler to wrap.

    DeepSpeed's schedulers read only ``param_groups`` (``lr``; ``betas`` for OneCycle, which it
    finds in ``defaults``) and check ``isinstance(optimizer, Optimizer)``, so this stands in for
    ``torch.optim.SGD([tensor], lr=0.0)``: the same single group, the same missing ``betas``.
    It skips ``Optimizer.__init__``, whose first call imports ``torch._dynamo``, about 2 s of CPU
    in a planning process that never trains.
    """
    import torch

    class SchedulerProbe(torch.optim.Optimizer):
        def __init__(self) -> None:  # no super().__init__: see above
            self.defaults = {"lr": 0.0}
            self.param_groups = [{"params": [], "lr": 0.0}]
            self.state = collections.defaultdict(dict)

    return SchedulerProbe()


def _check_scheduler(config: dict[str, Any]) -> None:
    scheduler = config.get("scheduler")
    if scheduler is None:
        return
    from deepspeed.runtime import lr_schedules

    name = scheduler.get("type") if isinstance(scheduler, dict) else None
    if not isinstance(name, str) or name not in lr_schedules.VALID_LR_SCHEDULES:
        raise ConfigError(
            f"{name!r} is not a DeepSpeed scheduler ({', '.join(lr_schedules.VALID_LR_SCHEDULES)})",
            key="scheduler.type",
        )
    # The engine builds the scheduler only at deepspeed.initialize; build it now on a stand-in
    # optimizer so that missing or misspelt parameters fail here.
    try:
        getattr(lr_schedules, name)(scheduler_probe(), **scheduler.get("params", {}))
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(
            f"DeepSpeed rejects the scheduler: {exc}", key="scheduler.params"
        ) from exc


def parse_recording(config: dict[str, Any], world_size: int) -> tuple[Any, set[Any]]:
    """DeepSpeed's own DeepSpeedConfig of ``config`` at ``world_size`` ranks, and the keys it read.

    Parsed as rank zero of a data-parallel group of ``world_size`` (no process group needed);
    DeepSpeed's exceptions pass through.
    """
    import_deepspeed_quietly()
    from deepspeed.runtime import config as config_module

    recording = _RecordingDict(config)
    with _as_rank_zero(config_module, world_size):
        parsed = config_module.DeepSpeedConfig(recording, mpu=_DataParallelGroup(world_size))
    return parsed, set(recording.read)


def validate_deepspeed_config(config: dict[str, Any], world_size: int) -> None:
    """Validate ``config`` with DeepSpeed's own DeepSpeedConfig at ``world_size`` ranks.

    Args:
        config: The ds_config.json contents.
        world_size: Data-parallel ranks the config will run on (nodes x GPUs per node).

    Raises:
        ConfigError: DeepSpeed rejects the config, or it has an ``"auto"`` value or a
            top-level key DeepSpeed does not read.
    """
    check_written_form(config, world_size)

    import_deepspeed_quietly()
    from deepspeed.runtime import config as config_module

    try:
        parsed, read = parse_recording(config, world_size)
    except (
        AssertionError,
        ValueError,
        TypeError,
        KeyError,
        config_module.DeepSpeedConfigError,
    ) as exc:
        # pydantic's ValidationError is a ValueError; batch arithmetic fails an assert.
        raise ConfigError(f"DeepSpeed rejects the config: {exc}") from exc
    if parsed.world_size != world_size:
        raise ConfigError(
            f"DeepSpeed parsed the config at world size {parsed.world_size}, not {world_size}"
        )
    unknown = sorted(str(key) for key in config if key not in read)
    if unknown:
        raise ConfigError(
            f"DeepSpeed does not read {', '.join(unknown)} and would ignore it",
            key=unknown[0],
        )
    _check_scheduler(config)
