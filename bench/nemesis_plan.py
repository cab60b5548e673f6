"""The fault schedule of ``make nemesis``: which fault, on which process, when, for how long.

Owns: the fault kinds, drawing a schedule from a seed (the same seed and options give the
same schedule), the scale of each kind's length to the run's duration, and a schedule's
JSON form. Pure: no I/O, no clock, no processes; bench/nemesis.py applies what this plans
(docs/operations.md, "Fault schedule (make nemesis)").

Kinds (``target`` is a role resolved when the fault is applied, by the servers' event
logs: ``active``, ``passive``, or ``witness``):

- ``kill``: kill -9, restarted after ``seconds``;
- ``freeze``: SIGSTOP, SIGCONT after ``seconds``;
- ``partition``: every packet between the two servers dropped, both ways;
- ``one_way``: the target's packets to the other server's AMQP port dropped (the other
  still reaches the target);
- ``isolate``: the target's only link down (clients cannot reach it either);
- ``witness_cut``: every packet between the target and the witness dropped;
- ``switchover``: a planned handover of the ACTIVE (``amqha console switchover``), between
  the faults: the old ACTIVE resumes as PASSIVE, or takes a snapshot; refused while its
  PASSIVE is not in sync;
- ``power_cut``: the target's kill -9 and its disk's loss of everything not fsynced
  (target ``both``: both servers at once), started again after ``seconds``;
- ``disk_error``: every fsync of the target's store fails with EIO for ``seconds``; then
  the disk is mended and the server restarted (a store whose disk failed writes nothing
  more until then: docs/durability.md, section 9);
- ``clock_step``: the target's wall clock stepped by an hour, forward or back (the sign is
  drawn: ``target`` ``active+`` or ``passive-`` and so on), for ``seconds``, then back.

The network kinds need the namespace harness (tests/netns.py), the disk kinds the
power-loss filesystem (tests/lazyfs.py), the clock kind libfaketime (tests/faketime.py);
the caller leaves them out where one is missing.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

PROCESS_KINDS = ("kill", "freeze")
NETWORK_KINDS = ("partition", "one_way", "isolate")
WITNESS_KINDS = ("witness_cut",)
HOOK_KINDS = ("switchover",)
DISK_KINDS = ("power_cut", "disk_error")
CLOCK_KINDS = ("clock_step",)
KINDS = PROCESS_KINDS + NETWORK_KINDS + WITNESS_KINDS + HOOK_KINDS + DISK_KINDS + CLOCK_KINDS
CLOCK_STEP = 3600  # seconds a clock_step moves the wall clock

MIN_FREEZE, MAX_FREEZE = 0.1, 120.0


@dataclass(frozen=True)
class Fault:
    """One fault: planned ``at`` seconds after the workload started, on ``target``, held
    ``seconds``."""

    at: float
    kind: str
    target: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def longest_freeze(duration: float) -> float:
    """The longest freeze a run of ``duration`` s draws: a quarter of the run, between
    1 s and 120 s (a 60 s run freezes at most 15 s; 480 s and longer, up to 120 s)."""
    return min(MAX_FREEZE, max(1.0, duration / 4))


def longest_cut(duration: float) -> float:
    """The longest partition: a sixth of the run, between 2 s and 60 s."""
    return min(60.0, max(2.0, duration / 6))


def longest_gap(duration: float) -> float:
    """The longest quiet time between two faults: a twentieth of the run, 3 s to 15 s."""
    return min(15.0, max(3.0, duration / 20))


def draw(rng: random.Random, kind: str, duration: float, witness: bool) -> tuple[str, float]:
    """(target, seconds) of one fault of ``kind``."""
    servers = ["active", "passive"]
    if kind == "freeze":
        # Log-uniform: as many 0.1-1 s freezes as 10-100 s ones.
        low, high = math.log(MIN_FREEZE), math.log(longest_freeze(duration))
        seconds = math.exp(rng.uniform(low, high))
        return rng.choice([*servers, "witness"] if witness else servers), seconds
    if kind == "kill":
        seconds = rng.uniform(0.2, min(10.0, max(1.0, duration / 20)))
        return rng.choice([*servers, "witness"] if witness else servers), seconds
    if kind in NETWORK_KINDS or kind in WITNESS_KINDS:
        return rng.choice(servers), rng.uniform(1.0, longest_cut(duration))
    if kind == "switchover":
        return "active", 0.0
    if kind == "power_cut":
        seconds = rng.uniform(0.2, min(10.0, max(1.0, duration / 20)))
        return rng.choice([*servers, "both"]), seconds
    if kind == "disk_error":
        return rng.choice(servers), rng.uniform(1.0, longest_cut(duration))
    if kind == "clock_step":
        sign = rng.choice("+-")
        return rng.choice(servers) + sign, rng.uniform(1.0, longest_cut(duration))
    raise ValueError(f"unknown fault kind {kind!r}; kinds are {', '.join(KINDS)}")


def schedule(
    seed: int, duration: float, kinds: tuple[str, ...], witness: bool = False
) -> list[Fault]:
    """Faults one after another from ``seed``: a quiet gap, a fault of a kind drawn from
    ``kinds``, its length, another gap, ... until ``duration`` s; none starts later than
    that. ``witness``: kills and freezes may hit the witness too."""
    if duration <= 0:
        raise ValueError(f"duration must be positive, not {duration}")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"fault kinds are {', '.join(KINDS)}; got {', '.join(kinds) or 'none'}")
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = rng.uniform(1.0, longest_gap(duration))
    for _ in range(100_000):  # bounded: every step moves ``at`` on by at least 1 s
        if at >= duration:
            break
        kind = rng.choice(kinds)
        target, seconds = draw(rng, kind, duration, witness)
        faults.append(Fault(round(at, 3), kind, target, round(seconds, 3)))
        at += seconds + rng.uniform(1.0, longest_gap(duration))
    return faults


def from_json(items: list[dict[str, Any]]) -> list[Fault]:
    """A schedule written out by ``Fault.to_json`` (or by hand), checked."""
    faults = []
    for item in items:
        kind = item.get("kind")
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r} in {item}; kinds are {', '.join(KINDS)}")
        target = item.get("target", "active")
        if kind == "clock_step":
            if target not in ("active+", "active-", "passive+", "passive-"):
                raise ValueError(
                    f"a clock_step's target is active or passive and the step's sign"
                    f" (active+, passive-, ...), not {target!r} in {item}"
                )
        elif target not in ("active", "passive", "witness", "both"):
            raise ValueError(
                f"target is active, passive, witness or both, not {target!r} in {item}"
            )
        if target == "both" and kind != "power_cut":
            raise ValueError(f"target both is for power_cut only, not {kind} in {item}")
        faults.append(Fault(float(item["at"]), kind, target, float(item.get("seconds", 0.0))))
    return sorted(faults, key=lambda f: f.at)
