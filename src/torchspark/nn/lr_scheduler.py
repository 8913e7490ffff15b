"""A network's learning-rate scheduler (``Network(lr_scheduler=...)``), driven by the network's own counters.

Two kinds:

- a torchspark [`Schedule`][torchspark.schedules.Schedule] (``CosineSchedule``, ``WarmupSchedule``, ...): before
  every step the learning rate of every parameter group is set to ``schedule.value(iteration, epoch)``;
- a ``torch.optim.lr_scheduler`` factory, ``optimizer -> scheduler`` (``lambda opt: CosineAnnealingLR(opt,
  T_max=1000)``), stepped per step (``interval="step"``) or per epoch (``"epoch"``).

Either way the schedule's position is not a counter of its own: it is the network's
[`iteration`][torchspark.Network] (steps taken) or ``epoch`` (finished epochs), which a saved network, a
checkpoint, every Spark or ParallelWrapper worker and every averaging round already carry. Before each step the
torch scheduler is brought to that position: stepped forward (once per step in a running fit, as a plain PyTorch
loop does after ``optimizer.step()``), restored from its saved ``state_dict`` when one was saved at that position,
or rebuilt and replayed from 0 when the counters went back (a fit restored after a failure). So the learning rate
of step ``t`` is the one a single-process PyTorch loop uses at step ``t``, on every worker.

The scheduler's ``state_dict`` (and the hyperparameters it sets in the optimizer's parameter groups, such as
``OneCycleLR``'s momentum) is stored as JSON when JSON keeps it exactly; otherwise (a ``MultiStepLR``'s integer
milestones) it is left out and a rebuilt network replays the scheduler from step 0 (a few microseconds a step).

Example::

    net = Network(module, updater=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                  lr_scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=1000))
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, Union

import torch
from torch.optim import lr_scheduler as torch_schedulers

from torchspark.errors import ConfigError, SerializationError
from torchspark.optim import UpdaterSpec, exact_json
from torchspark.schedules import Schedule, schedule_from_dict
from torchspark.validation import check_choice

__all__ = [
    "INTERVALS",
    "LrSchedulerFactory",
    "LrSchedulerLike",
    "LrScheduling",
    "make_lr_scheduling",
    "lr_scheduler_to_json",
    "lr_scheduler_from_json",
]

#: when a torch scheduler steps: after every updater step, or after every epoch
INTERVALS = ("step", "epoch")

#: ``optimizer -> torch.optim.lr_scheduler.LRScheduler``
LrSchedulerFactory = Callable[[torch.optim.Optimizer], Any]

#: what ``Network(lr_scheduler=...)`` takes
LrSchedulerLike = Union[Schedule, LrSchedulerFactory]

# torch warns when a scheduler steps before the optimizer has (a replay, or a step fp16's scaler skipped)
_ORDER_WARNING = r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"


def _describe(factory: Any) -> str:
    if isinstance(factory, functools.partial):
        return repr(factory)
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None)
    module = getattr(factory, "__module__", None)
    return f"{module}.{name}" if name and module else repr(factory)


def build_torch_scheduler(factory: LrSchedulerFactory, optimizer: torch.optim.Optimizer) -> Any:
    """``factory(optimizer)``, checked.

    Raises:
        ConfigError: the factory raised (the message names it and its error), returned something other than a
            ``torch.optim.lr_scheduler`` scheduler, returned ``ReduceLROnPlateau`` (it steps on a metric, not a
            counter) or a scheduler of another optimizer.
    """
    name = _describe(factory)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ORDER_WARNING)
            scheduler = factory(optimizer)
    except Exception as e:
        raise ConfigError(
            f"lr_scheduler factory {name} raised {type(e).__name__}: {e}; it is called with the network's "
            "torch.optim optimizer and must return a torch.optim.lr_scheduler scheduler of it, e.g. "
            "lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)"
        ) from e
    if isinstance(scheduler, torch_schedulers.ReduceLROnPlateau):
        raise ConfigError(
            f"lr_scheduler factory {name} returned ReduceLROnPlateau, which steps on a validation metric, not on "
            "the step or epoch count; use a counter-driven scheduler, or early stopping with a score "
            "(torchspark.earlystopping)"
        )
    if not isinstance(scheduler, torch_schedulers.LRScheduler):
        raise ConfigError(
            f"lr_scheduler factory {name} returned {type(scheduler).__name__}, expected a "
            "torch.optim.lr_scheduler scheduler (LRScheduler) built on the optimizer it is given"
        )
    if scheduler.optimizer is not optimizer:
        raise ConfigError(
            f"lr_scheduler factory {name} returned a scheduler of another optimizer; build it on the optimizer "
            "the factory is given (lambda opt: CosineAnnealingLR(opt, T_max=1000))"
        )
    return scheduler


def _group_settings(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


class LrScheduling:
    """A network's schedule: a torchspark ``Schedule`` or a torch scheduler, brought to the network's counters
    before every step by `sync`.

    Args:
        scheduler: a ``Schedule`` or a factory ``optimizer -> torch.optim.lr_scheduler.LRScheduler``.
        interval: for a factory, ``"step"`` (default) or ``"epoch"``; None for a ``Schedule`` (its ``unit`` says).
        optimizer: the network's optimizer (a factory is called with it now, so a bad factory fails here).
    Raises:
        ConfigError: see `build_torch_scheduler`; an interval other than ``"step"``/``"epoch"``, or one given
            with a ``Schedule``.
    """

    def __init__(self, scheduler: LrSchedulerLike, interval: str | None, optimizer: torch.optim.Optimizer) -> None:
        self.spec = scheduler
        self.optimizer = optimizer
        self._pending: dict[str, Any] | None = None
        self.torch_scheduler: Any = None
        if isinstance(scheduler, Schedule):
            if interval is not None:
                raise ConfigError(
                    f"lr_scheduler_interval={interval!r} is for torch.optim.lr_scheduler factories; a "
                    f"{type(scheduler).__name__} counts its own unit ({getattr(scheduler, 'unit', '?')!r}): "
                    "leave lr_scheduler_interval out"
                )
            self.interval = "step"
            return
        if not callable(scheduler):
            raise ConfigError(
                "lr_scheduler must be a torchspark.schedules Schedule (CosineSchedule(1e-3, t_max=1000)) or a "
                f"factory optimizer -> torch.optim.lr_scheduler scheduler, got {scheduler!r}"
            )
        self.interval = check_choice(
            "lr_scheduler_interval", "step" if interval is None else interval, INTERVALS, owner="Network"
        )
        self._initial = [_group_settings(g) for g in optimizer.param_groups]
        self.torch_scheduler = build_torch_scheduler(scheduler, optimizer)

    def sync(self, iteration: int, epoch: int) -> None:
        """Set the optimizer's learning rate (and whatever else the scheduler sets) for the step after
        ``iteration`` steps and ``epoch`` finished epochs."""
        if isinstance(self.spec, Schedule):
            lr = self.spec.value(iteration, epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            return
        t = iteration if self.interval == "step" else epoch
        pending, self._pending = self._pending, None
        if pending is not None and pending["scheduler"].get("last_epoch") == t:
            self._load(pending)
            return
        if self.torch_scheduler.last_epoch > t:
            self._rebuild()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ORDER_WARNING)
            while self.torch_scheduler.last_epoch < t:
                position = self.torch_scheduler.last_epoch + 1
                try:
                    self.torch_scheduler.step()
                except Exception as e:
                    raise ConfigError(
                        f"lr_scheduler {type(self.torch_scheduler).__name__} (from {_describe(self.spec)}) failed at "
                        f"{self.interval} {position}: {type(e).__name__}: {e}; the "
                        "schedule is shorter than the training (OneCycleLR's total_steps, ...): make it cover "
                        "every step (epochs x steps per epoch per worker)"
                    ) from e

    def _rebuild(self) -> None:
        for group, initial in zip(self.optimizer.param_groups, self._initial):
            group.update(initial)
        assert not isinstance(self.spec, Schedule)  # a Schedule has no torch scheduler to rebuild
        self.torch_scheduler = build_torch_scheduler(self.spec, self.optimizer)

    def _load(self, state: dict[str, Any]) -> None:
        if self.torch_scheduler.last_epoch != 0:
            self._rebuild()
        self.torch_scheduler.load_state_dict(state["scheduler"])
        for group, saved in zip(self.optimizer.param_groups, state["groups"]):
            for key, value in saved.items():
                if key in group:
                    group[key] = tuple(value) if isinstance(group[key], tuple) else value

    def state(self, iteration: int, epoch: int) -> dict[str, Any] | None:
        """The torch scheduler's ``state_dict`` and parameter-group settings at the counters, as JSON values; None
        for a ``Schedule`` or when JSON cannot keep the state exactly (a rebuilt network then replays)."""
        if self.torch_scheduler is None:
            return None
        self.sync(iteration, epoch)
        groups = []
        for group in self.optimizer.param_groups:
            groups.append({k: v for k, v in _group_settings(group).items() if exact_json(v) is not None})
        return exact_json({"scheduler": self.torch_scheduler.state_dict(), "groups": groups})

    def restore(self, state: dict[str, Any] | None) -> None:
        """Use ``state`` (from `state`) at the next `sync` if it is for the position the counters then give
        (else the scheduler replays to it)."""
        if self.torch_scheduler is None or not state:
            return
        if not isinstance(state, dict) or not isinstance(state.get("scheduler"), dict):
            raise SerializationError(
                f"the saved lr_scheduler_state is not a scheduler's state ({str(state)[:80]}); the config is damaged"
            )
        self._pending = state


def make_lr_scheduling(
    scheduler: LrSchedulerLike | None, interval: str | None, optimizer: torch.optim.Optimizer, updater: Any = None
) -> LrScheduling | None:
    """`LrScheduling` for ``scheduler``, else for the schedule that is ``updater``'s ``lr``, else None.

    Raises:
        ConfigError: see `LrScheduling`; an interval without a scheduler; a scheduler and an updater whose ``lr`` is
            a schedule.
    """
    own = getattr(updater, "lr_schedule", None) if isinstance(updater, UpdaterSpec) else None
    if scheduler is None:
        if interval is not None:
            raise ConfigError(
                f"lr_scheduler_interval={interval!r} without an lr_scheduler; pass lr_scheduler=... or leave the "
                "interval out"
            )
        return None if own is None else LrScheduling(own, None, optimizer)
    if own is not None:
        raise ConfigError(
            f"the updater's lr is a schedule ({type(own).__name__}) and lr_scheduler is given too; use one: a "
            "number as the updater's lr with lr_scheduler, or no lr_scheduler"
        )
    return LrScheduling(scheduler, interval, optimizer)


def lr_scheduler_to_json(scheduler: LrSchedulerLike) -> dict[str, Any] | None:
    """A JSON form of ``scheduler`` when it has one: a ``Schedule``, or a ``functools.partial`` of a
    ``torch.optim.lr_scheduler`` class with JSON arguments (``partial(CosineAnnealingLR, T_max=1000)``); None for
    anything else (a lambda travels pickled in memory, and is saved only with ``allow_pickle=True``)."""
    if isinstance(scheduler, Schedule):
        return {"schedule": scheduler.to_dict()}
    if isinstance(scheduler, functools.partial) and not scheduler.args:
        func = scheduler.func
        name = getattr(func, "__name__", "")
        kwargs = exact_json(dict(scheduler.keywords))
        if getattr(torch_schedulers, name, None) is func and isinstance(func, type) and kwargs is not None:
            return {"torch": name, "kwargs": kwargs}
    return None


def lr_scheduler_from_json(data: Any, source: str) -> LrSchedulerLike:
    """The inverse of `lr_scheduler_to_json` (only ``torch.optim.lr_scheduler`` classes are looked up).

    Raises:
        SerializationError: not such a form (the message names ``source``).
    """
    if isinstance(data, dict) and isinstance(data.get("schedule"), dict):
        try:
            return schedule_from_dict(data["schedule"])
        except ConfigError as e:
            raise SerializationError(f"{source} has an lr_scheduler that cannot be built: {e}") from e
    if isinstance(data, dict) and isinstance(data.get("torch"), str) and isinstance(data.get("kwargs"), dict):
        cls = getattr(torch_schedulers, data["torch"], None)
        if isinstance(cls, type) and issubclass(cls, torch_schedulers.LRScheduler):
            return functools.partial(cls, **data["kwargs"])
    raise SerializationError(
        f"{source} has an lr_scheduler entry torchspark cannot read ({str(data)[:80]}); the file is damaged or was "
        "written by a newer torchspark"
    )
