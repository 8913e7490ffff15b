"""How the workers of one fit find and talk to each other: the worker-mesh options, validated in one place.

Both training masters carry these options as flat keyword arguments (``port=``, ``network_mask=`` ...) and hand
them to the runners as one [`MeshConfig`][torchspark.MeshConfig] (``master.mesh``), which is where they are checked.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError
from torchspark.validation import check_bool, check_choice, check_float, check_int

__all__ = ["MeshConfig", "MESH_FIELDS", "RENDEZVOUS_ROUTES", "MAX_TIMEOUT_S"]

#: How the workers of a barrier stage learn worker 0's address.
RENDEZVOUS_ROUTES = ("driver", "barrier")


#: the longest rendezvous_timeout_s taken: one week
MAX_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class MeshConfig:
    """The worker-mesh options of a fit: how workers find worker 0 (``rendezvous_via``, ``port``, ``port_range``,
    ``controller_address``), which interface they advertise (``network_mask``; ``TORCHSPARK_LOCAL_IP`` on an
    executor overrides it), how long any wait may last (``rendezvous_timeout_s``) and whether workers of one host
    sum through ``/dev/shm`` (``shared_memory_allreduce``).

    Each option is documented once, in docs/guides/masters.md (the option table; the masters carry them as flat
    keywords), and firewalls and interfaces in docs/guides/cluster.md.

    Raises:
        ConfigError: a value out of range (a port outside ``[0, 65535]``, a mask that is not a CIDR, a timeout not
            in ``(0, one week]``), or ``port`` together with ``port_range``, naming it and the fix.
    """

    port: int = 0
    network_mask: str | None = None
    controller_address: str | None = None
    rendezvous_via: str = "driver"
    rendezvous_timeout_s: float = 300.0
    shared_memory_allreduce: bool = True
    port_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        check_int("port", self.port, 0, 65535, meaning="(0 = any free port)")
        if self.network_mask is not None:
            try:
                ipaddress.ip_network(self.network_mask, strict=False)
            except (TypeError, ValueError) as e:
                raise ConfigError(
                    f"network_mask must be a CIDR such as '10.0.0.0/16', got {self.network_mask!r}"
                ) from e
        if self.controller_address is not None and (
            not isinstance(self.controller_address, str) or not self.controller_address.strip()
        ):
            raise ConfigError(
                f"controller_address must be a non-empty host or IP string or None, got {self.controller_address!r}"
            )
        check_choice("rendezvous_via", self.rendezvous_via, RENDEZVOUS_ROUTES)
        # a bound every clock and socket API takes (inf or 1e300 overflow deep inside a wait otherwise)
        check_float(
            "rendezvous_timeout_s",
            self.rendezvous_timeout_s,
            above=0,
            maximum=MAX_TIMEOUT_S,
            finite=True,
            unit="seconds",
            fix="pass a finite number of seconds (the default is 300; at most one week)",
        )
        if self.port_range is not None:
            object.__setattr__(self, "port_range", _port_range(self.port_range))
            if self.port:
                raise ConfigError(
                    f"set port ({self.port}) or port_range ({self.port_range}), not both: port_range "
                    "already covers worker 0's store"
                )
        check_bool("shared_memory_allreduce", self.shared_memory_allreduce)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeshConfig:
        unknown = sorted(set(d) - set(MESH_FIELDS))
        if unknown:
            raise ConfigError(f"unknown mesh option(s) {unknown}; known: {list(MESH_FIELDS)}")
        return cls(**d)


def _port_range(value: Any) -> tuple[int, int]:
    """``value`` as a validated ``(first, last)`` tuple (JSON gives a list)."""
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or not 1 <= value[0] <= value[1] <= 65535:
        raise ConfigError(
            f"port_range must be (first, last) with 1 <= first <= last <= 65535, e.g. (40000, 40100), got {value!r}"
        )
    return int(value[0]), int(value[1])


#: The option names, as they appear flat on the training masters.
MESH_FIELDS = tuple(f.name for f in dataclasses.fields(MeshConfig))
