"""The fact-table machinery shared by XCCL (:mod:`funcoll.transport.xpu`) and TorchTPU (:mod:`funcoll.transport.tpu`),
whose files hold only their rows (with upstream sources) and their own gate."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Dict, Mapping, Optional, Tuple

from funcoll.transport import Capabilities

Version = Tuple[int, ...]


def parse_version(v, what: str, example: str) -> Optional[Version]:
    """'2.9.0+xpu' -> (2, 9, 0); '2021.16.1' -> (2021, 16, 1); a tuple stays; None/'' -> None. Text that does not
    start with a number is a ValueError: ``"{what} from {v!r}; write it as e.g. {example}"``."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    if isinstance(v, tuple):
        return tuple(int(x) for x in v)
    m = re.match(r"\s*(\d+(?:\.\d+)*)", str(v))
    if not m:
        raise ValueError(f"{what} from {v!r}; write it as e.g. {example}")
    return row_key(m.group(1))


def row_key(row: str) -> Version:
    """A table's version row ('2.13', '0.2') as a comparable version."""
    return tuple(int(x) for x in row.split("."))


def version_text(v: Optional[Version]) -> str:
    return ".".join(map(str, v)) if v else "unknown"


@dataclass(frozen=True)
class Fact:
    """One fact about a backend, with its upstream source."""

    key: str
    what: str  # the request
    strategy: str  # what funcoll does where the fact is not native
    source: str
    by_version: Tuple[Tuple[str, str], ...] = ()  # (first row, what the backend does), each in force until the next
    unknown: str = ""  # what no source says, and the safe choice funcoll makes
    info: bool = False  # a rule funcoll respects or reports on every version (it switches no plan)
    # from which version funcoll hands the request to the backend by default (None: never): torch_tpu's row for
    # TorchTPU; for XCCL, the oneCCL found at run time on the scale-up path
    native_since: Optional[Version] = None
    # XCCL's own gate (oneCCL's scale-up and scale-out paths have different reduce ops):
    scale_out_since: Optional[Version] = None  # native_since on the scale-out path
    overridable: Tuple[str, ...] = ()  # the topologies where FUNCOLL_XPU_OVERRIDE may flip it (none where it raises)
    build: str = ""  # what depends on the oneCCL torch was built against
    always: bool = False  # native on every stack of its backend (done inside the backend, not by oneCCL)
    if_unknown: str = field(default="", compare=False)  # what at(None) says; set by table()

    def at(self, row: Optional[str]) -> str:
        """What the backend does on version ``row`` (the ``by_version`` entry in force there; "" if none); on an unknown
        version (None), what funcoll does there."""
        if row is None:
            return self.if_unknown
        return next((what for first, what in reversed(self.by_version) if row_key(first) <= row_key(row)), "")


def table(version: str, otherwise: Callable[[Fact], str], *facts: Fact) -> Dict[str, Fact]:
    """key -> fact, in order. On an unknown version :meth:`Fact.at` says "unknown <version> version: " and the fact's
    ``unknown`` text, or ``otherwise(fact)`` where it has none."""
    return {f.key: replace(f, if_unknown=f"unknown {version} version: {f.unknown or otherwise(f)}") for f in facts}


def label(fact: Fact, native: bool, why: str = "") -> str:
    """A fact's entry in derived capabilities' ``sources``: "info", "native" or "strategy", then ``why`` (what keeps it
    off the native path beyond its table) and its source."""
    if fact.info:
        return f"info: {fact.source}"
    return f"{'native' if native else 'strategy'}: {why}{'; ' if why else ''}{fact.source}"


@dataclass(frozen=True)
class VersionedCapabilities(Capabilities):
    """Capabilities plus the versions (and topology) a fact table derived them for."""

    versions: Mapping[str, str] = field(default_factory=dict, compare=False)

    def plain(self, **changes) -> Capabilities:
        """The same capabilities without the versions (a profile), with ``changes``."""
        return Capabilities(**{**{f.name: getattr(self, f.name) for f in fields(Capabilities)}, **changes})
