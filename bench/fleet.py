"""A fleet of HA pairs' event logs, for the report's benchmark and tests.

    python -m bench.fleet OUT --pairs 20 --days 7 --events 1000000 [--seed 1]

Owns: writing ``OUT/pair=NAME/{primary,backup}/events.jsonl`` for each pair, rotated once a
day (``events.jsonl.N.gz`` for the older days, gzip, the newest day plain), with records that
name their pair. Each pair lives a realistic life: a steady trickle of clients redirected by
the PASSIVE server, incidents at random (kill -9 of the ACTIVE with a client-vote takeover and
restart, a console failback, a peer-link cut with dual active healed by the epoch rule), a
redirect storm after each takeover, and its backup's clock off by a fixed skew that both
servers' peer records reveal. Most pairs replicate: their ACTIVE logs ``sync`` records (out
of sync when it becomes ACTIVE alone or loses its PASSIVE, in sync once one has caught up)
and the loser of a dual active a ``quarantine``; the others log none, as servers with
replication off do. Seeded: the same arguments give the same files (the sync records come
from a stream of their own, so the other records are those of a fleet without them).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
from pathlib import Path

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 86400  # a UTC midnight
DAY = 86400.0
LATENCY = 0.0005
TIMEOUT = 3.0
START = {"primary": "PRIMARY", "backup": "BACKUP"}


REPLICATING = 0.75  # the share of pairs whose servers log sync records


class _Sync:
    """A pair's replication records, from their own random stream (the pair's other records
    are the same with or without them); nothing for a pair that does not replicate."""

    def __init__(self, name: str) -> None:
        self.rng = random.Random(f"sync {name}")
        self.on = self.rng.random() < REPLICATING

    def lost(self, active: _Server, at: float, reason: str) -> None:
        if self.on:
            active.write(at, "sync", f',"side":"active","sync":"out_of_sync","reason":"{reason}"')

    def caught_up(self, active: _Server, passive: _Server, at: float, most: float) -> None:
        """The PASSIVE, then the ACTIVE, in sync within ``most`` seconds of ``at``."""
        if self.on:
            done = at + self.rng.uniform(0.05, most)
            passive.write(done - 0.001, "sync", ',"side":"passive","sync":"in_sync"')
            active.write(done, "sync", ',"side":"active","sync":"in_sync","lag_changes":0')

    def quarantine(self, loser: _Server, at: float) -> None:
        if self.on:
            messages = self.rng.randrange(1, 500)
            path = f"/var/lib/amqha/{loser.node}/quarantine/{int(at)}-{loser.node}.sqlite"
            loser.write(at, "quarantine", f',"messages":{messages},"path":"{path}"')


class _Server:
    """One server's log for one pair: records on its own clock, rotated by day."""

    def __init__(self, folder: Path, pair: str, node: str, skew: float) -> None:
        self.folder = folder / node
        self.folder.mkdir(parents=True)
        self.node, self.skew = node, skew
        self.head = (
            '{"v":1,"ts":%.6f,"node":"' + node + '","role":"' + node + '","epoch":%d,'
            '"state":"%s","event":"%s","pair":"' + pair + '"'
        )
        self.lines: list[str] = []
        self.count = 0
        self.day = 0
        self.rotations = 0
        self.state, self.epoch = START[node], 0

    def clock(self, at: float) -> float:
        return at + self.skew

    def write(self, at: float, event: str, extra: str = "", state: str | None = None) -> None:
        while at >= T0 + (self.day + 1) * DAY:
            self._rotate()
        self.lines.append(
            self.head % (self.clock(at), self.epoch, state or self.state, event) + extra + "}\n"
        )
        self.count += 1

    def transition(self, at: float, new: str, trigger: str, epoch: int | None = None) -> None:
        old, self.state = self.state, new
        if epoch is not None:
            self.epoch = epoch
        self.write(at, "transition", f',"from":"{old}","to":"{new}","trigger":"{trigger}"')

    def heard(
        self, at: float, event: str, peer: _Server, sent: float, evidence: str | None = None
    ) -> None:
        extra = (
            f',"peer":"{peer.node}","peer_state":"{peer.state}","last_seen":{peer.clock(sent):.6f}'
        )
        if evidence is not None:  # peer_lost: a refused port (process gone) or a timeout
            extra += f',"evidence":"{evidence}"'
        self.write(at, event, extra)

    def redirects(
        self, start: float, end: float, rate: float, rng: random.Random, to: str
    ) -> float:
        """Clients turned away at ``rate`` a second from ``start`` to ``end``."""
        at = start + rng.expovariate(rate)
        while at < end:
            client = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}:5"
            if rng.random() < 0.02:
                self.write(at, "refuse", f',"client":"{client}","to":null')
            else:
                self.write(at, "redirect", f',"client":"{client}","to":"{to}"')
            at += rng.expovariate(rate)
        return end

    def _rotate(self) -> None:
        self.rotations += 1
        path = self.folder / f"events.jsonl.{self.rotations}.gz"
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as stream:
            stream.writelines(self.lines)
        self.lines = []
        self.day += 1

    def close(self) -> None:
        (self.folder / "events.jsonl").write_text("".join(self.lines), encoding="utf-8")
        self.lines = []


def _pair(folder: Path, name: str, days: int, events: int, rng: random.Random) -> int:
    skew = rng.choice([0.0, 0.0, rng.uniform(-2.0, 2.0)])
    primary = _Server(folder, name, "primary", 0.0)
    backup = _Server(folder, name, "backup", skew)
    sync = _Sync(name)
    alone = "ACTIVE with no in-sync passive"
    end = T0 + days * DAY
    # Redirect trickle sized so the pair writes about `events` records.
    rate = max(events / (days * DAY), 1e-4)
    incidents = max(1, int(rng.uniform(0.5, 4.0) * days))
    at = T0 + rng.uniform(0, 60)
    primary.write(at, "started")
    backup.write(at + 0.3, "started")
    backup.heard(at + 0.5 + LATENCY, "peer_up", primary, at + 0.5)
    primary.heard(at + 0.6 + LATENCY, "peer_up", backup, at + 0.6)
    primary.transition(at + 0.7, "ACTIVE", "PEER_BACKUP", 1)
    sync.lost(primary, at + 0.7001, alone)
    backup.transition(at + 0.8, "PASSIVE", "PEER_ACTIVE", 1)
    sync.caught_up(primary, backup, at + 0.8, 0.19)
    active, passive = primary, backup
    at += 1.0
    gaps = sorted(rng.uniform(at, end - 600) for _ in range(incidents))
    for when in gaps:
        if when <= at:
            continue
        at = passive.redirects(at, when, rate, rng, "active")
        kind = rng.random()
        epoch = max(primary.epoch, backup.epoch)
        if kind < 0.5:  # kill -9 of the ACTIVE, takeover by client vote, restart as PASSIVE
            seen = at - rng.uniform(0, 0.2)
            passive.heard(at + TIMEOUT, "peer_lost", active, seen, "refused")
            dead, survivor = active, passive
            dead.state = "DOWN"
            took = at + TIMEOUT + rng.uniform(0.05, 3.0)
            survivor.transition(took, "ACTIVE", "CLIENT_REQUEST", epoch + 1)
            sync.lost(survivor, took + 0.001, alone)
            at = survivor.redirects(took, took + 5, rate * 400 + 50, rng, "active")  # storm
            back = at + rng.uniform(5, 120)
            dead.state, dead.epoch = START[dead.node], epoch
            dead.write(back, "started")
            survivor.heard(back + 0.2 + LATENCY, "peer_up", dead, back + 0.2)
            dead.heard(back + 0.3 + LATENCY, "peer_up", survivor, back + 0.3)
            dead.transition(back + 0.31, "PASSIVE", "PEER_ACTIVE", epoch + 1)
            sync.caught_up(survivor, dead, back + 0.31, 0.6)
            active, passive = survivor, dead
            at = back + 1.0
        elif kind < 0.8 and active is backup:  # console failback
            backup.write(at, "console", ',"user":"admin","command":"recover","result":"ok"')
            backup.transition(at + 0.01, "PASSIVE", "MANUAL_RECOVER")
            handover = at + 0.01 + rng.uniform(0.02, 0.2)
            primary.transition(handover, "ACTIVE", "HANDOVER", epoch + 1)
            sync.lost(primary, handover + 0.001, alone)
            sync.caught_up(primary, backup, handover + 0.001, 0.7)
            active, passive = primary, backup
            at += 1.0
        else:  # peer link cut: both lose each other, the passive goes ACTIVE too, then heals
            active.heard(at + TIMEOUT, "peer_lost", passive, at, "silence")
            sync.lost(active, at + TIMEOUT + 0.001, "the in-sync PASSIVE left")
            passive.heard(at + TIMEOUT + 0.05, "peer_lost", active, at, "silence")
            took = at + TIMEOUT + rng.uniform(0.5, 5.0)
            passive.transition(took, "ACTIVE", "CLIENT_REQUEST", epoch + 1)
            sync.lost(passive, took + 0.001, alone)
            heal = took + rng.uniform(1, 60)
            passive.heard(heal + LATENCY, "peer_up", active, heal)
            active.heard(heal + 0.01 + LATENCY, "peer_up", passive, heal + 0.01)
            active.write(
                heal + 0.02,
                "dual_active",
                f',"peer":"{passive.node}","peer_epoch":{epoch + 1},"reason":"higher epoch"',
            )
            active.transition(heal + 0.03, "PASSIVE", "DUAL_ACTIVE", epoch + 1)
            sync.quarantine(active, heal + 0.05)
            sync.caught_up(passive, active, heal + 0.05, 0.9)
            active, passive = passive, active
            at = heal + 1.0
    at = passive.redirects(at, end - 1, rate, rng, "active")
    primary.write(end - 0.5, "stopped")
    backup.write(end - 0.4, "stopped")
    for server in (primary, backup):
        server.close()
    return primary.count + backup.count


def generate_fleet(
    folder: Path, events: int, pairs: int = 10, days: int = 7, seed: int = 1
) -> dict[str, int]:
    """Write about ``events`` records over ``pairs`` pairs and ``days`` days; returns the
    records written per pair."""
    rng = random.Random(seed)
    weights = [rng.uniform(0.5, 1.5) for _ in range(pairs)]  # pairs differ in load
    written = {}
    for index, weight in enumerate(weights):
        name = f"pair-{index:03d}"
        share = int(events * weight / sum(weights))
        written[name] = _pair(folder / f"pair={name}", name, days, share, rng)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    written = generate_fleet(args.out, args.events, args.pairs, args.days, args.seed)
    print(json.dumps({"pairs": len(written), "events": sum(written.values())}))


if __name__ == "__main__":
    main()
