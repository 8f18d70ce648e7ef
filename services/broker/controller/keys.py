"""The controller's etcd layout and the JSON codecs of its values (DESIGN.md §6).

One broker group (the replicas of one ``brokerName``) keeps its election state under
``P = {controllerKeyPrefix}/{brokerClusterName}/{brokerName}``:

| key            | value (JSON)                                                   | writer  |
|----------------|----------------------------------------------------------------|---------|
| P/leader       | {replica_id, addr, epoch}                                      | leader¹ |
| P/epoch        | {epoch}                                                        | winner² |
| P/isr          | {epoch, replica_ids: [...]} (the leader's own id included)     | leader³ |
| P/members/{id} | {replica_id, addr, max_offset, last_epoch, priority, eligible} | each⁴   |
| P/handover     | {target_replica_id, epoch}                                     | master⁵ |

¹ under its lease; ² in the election txn; ³ in a txn guarded by its P/leader value (the winner
writes {itself} in the election txn); ⁴ each replica, under its own lease, about every second;
⁵ a master handing over (switchover), together with deleting P/leader.

Values are decoded strictly (every field present, of the right type): a value that does not
decode is reported as a problem of the snapshot and otherwise ignored, except the leader key,
whose mere presence still counts (nobody campaigns against a leader key, even an unreadable one;
it disappears with its lease).

The whole group is read in one range request, so a :class:`Snapshot` is consistent at one etcd
revision; every decision the controller takes starts from one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

MEMBERS_MAX = 64
"""Member keys beyond this many are ignored (a group has a handful of replicas)."""


@dataclass(frozen=True)
class LeaderInfo:
    """The group's elected master: who, where (its gRPC address, Replication is served there)
    and in which epoch it leads."""

    replica_id: int
    addr: str
    epoch: int


@dataclass(frozen=True)
class MemberState:
    """What one replica publishes about itself, and what elections rank by."""

    replica_id: int
    addr: str
    max_offset: int
    """Its commitlog max offset."""
    last_epoch: int
    """The newest epoch in its epoch history (0 for a store that never saw a failover)."""
    priority: int
    """brokerElectionPriority: lower wins among equally up-to-date replicas."""
    eligible: bool
    """False for an observer (brokerRole SLAVE in controller mode): never elected."""


@dataclass(frozen=True)
class IsrRecord:
    """The in-sync replica set as the leader of ``epoch`` published it."""

    epoch: int
    replica_ids: frozenset[int]


@dataclass(frozen=True)
class HandoverRecord:
    """A master of ``epoch`` handing its role to ``target_replica_id``."""

    target_replica_id: int
    epoch: int


class GroupKeys:
    """Key names of one broker group."""

    def __init__(self, prefix: str, cluster_name: str, broker_name: str) -> None:
        self.root = f"{prefix.rstrip('/')}/{cluster_name}/{broker_name}"
        self.prefix = (self.root + "/").encode()
        """Every key of the group starts with this (the range read and the watch)."""
        self.leader = f"{self.root}/leader".encode()
        self.epoch = f"{self.root}/epoch".encode()
        self.isr = f"{self.root}/isr".encode()
        self.handover = f"{self.root}/handover".encode()
        self.members_prefix = f"{self.root}/members/".encode()

    def member(self, replica_id: int) -> bytes:
        return self.members_prefix + str(replica_id).encode()


def _dump(obj: dict[str, object]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _load(raw: bytes) -> dict[str, object]:
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def _int(obj: dict[str, object], name: str) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def _str(obj: dict[str, object], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


def _bool(obj: dict[str, object], name: str) -> bool:
    value = obj.get(name)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def encode_leader(leader: LeaderInfo) -> bytes:
    return _dump(asdict(leader))


def decode_leader(raw: bytes) -> LeaderInfo:
    obj = _load(raw)
    return LeaderInfo(_int(obj, "replica_id"), _str(obj, "addr"), _int(obj, "epoch"))


def encode_epoch(epoch: int) -> bytes:
    return _dump({"epoch": epoch})


def decode_epoch(raw: bytes) -> int:
    epoch = _int(_load(raw), "epoch")
    if epoch < 0:
        raise ValueError(f"negative epoch {epoch}")
    return epoch


def encode_isr(isr: IsrRecord) -> bytes:
    return _dump({"epoch": isr.epoch, "replica_ids": sorted(isr.replica_ids)})


def decode_isr(raw: bytes) -> IsrRecord:
    obj = _load(raw)
    ids = obj.get("replica_ids")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ValueError(f"replica_ids must be a list of integers, got {ids!r}")
    return IsrRecord(_int(obj, "epoch"), frozenset(ids))


def encode_member(member: MemberState) -> bytes:
    return _dump(asdict(member))


def decode_member(raw: bytes) -> MemberState:
    obj = _load(raw)
    return MemberState(
        replica_id=_int(obj, "replica_id"),
        addr=_str(obj, "addr"),
        max_offset=_int(obj, "max_offset"),
        last_epoch=_int(obj, "last_epoch"),
        priority=_int(obj, "priority"),
        eligible=_bool(obj, "eligible"),
    )


def encode_handover(handover: HandoverRecord) -> bytes:
    return _dump(asdict(handover))


def decode_handover(raw: bytes) -> HandoverRecord:
    obj = _load(raw)
    return HandoverRecord(_int(obj, "target_replica_id"), _int(obj, "epoch"))


@dataclass(frozen=True)
class KeyValue:
    """One key as read from etcd (the fields decisions need)."""

    key: bytes
    value: bytes
    mod_revision: int
    lease: int = 0


@dataclass
class Snapshot:
    """The group's keys decoded, consistent at one etcd revision."""

    revision: int = 0
    leader_present: bool = False
    leader: LeaderInfo | None = None
    """None when absent or undecodable (see ``leader_present``)."""
    leader_raw: bytes = b""
    leader_mod_revision: int = 0
    leader_lease: int = 0
    epoch: int = 0
    """The group's newest epoch (0 before the first election)."""
    epoch_mod_revision: int = 0
    """0 when P/epoch is absent: the election txn compares it, so two campaigns on the same
    read cannot both bump the epoch."""
    isr: IsrRecord | None = None
    """None = no election ever finished (a brand-new group)."""
    handover: HandoverRecord | None = None
    members: dict[int, MemberState] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Keys whose values did not decode (logged by the controller)."""


def parse_snapshot(keys: GroupKeys, revision: int, kvs: Iterable[KeyValue]) -> Snapshot:
    """Decode every key of one group read (unknown keys under the prefix are ignored)."""
    snap = Snapshot(revision=revision)
    for kv in kvs:
        try:
            _apply(keys, snap, kv)
        except ValueError as exc:
            snap.problems.append(f"{kv.key.decode(errors='replace')}: {exc}")
    return snap


def _apply(keys: GroupKeys, snap: Snapshot, kv: KeyValue) -> None:
    if kv.key == keys.leader:
        snap.leader_present = True
        snap.leader_raw = kv.value
        snap.leader_mod_revision = kv.mod_revision
        snap.leader_lease = kv.lease
        snap.leader = decode_leader(kv.value)
    elif kv.key == keys.epoch:
        # decoded first: a campaign on an unreadable epoch must fail its compare, never reset it
        snap.epoch = decode_epoch(kv.value)
        snap.epoch_mod_revision = kv.mod_revision
    elif kv.key == keys.isr:
        snap.isr = decode_isr(kv.value)
    elif kv.key == keys.handover:
        snap.handover = decode_handover(kv.value)
    elif kv.key.startswith(keys.members_prefix):
        if len(snap.members) >= MEMBERS_MAX:
            raise ValueError(f"more than {MEMBERS_MAX} members; ignored")
        member = decode_member(kv.value)
        suffix = kv.key[len(keys.members_prefix) :]
        if suffix != str(member.replica_id).encode():
            raise ValueError(f"names replica {member.replica_id} under another id")
        snap.members[member.replica_id] = member
