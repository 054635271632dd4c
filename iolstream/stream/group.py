"""Group learning, the bookkeeping (no Kafka): one model over a consumer group (docs/scaling.md).

Each member learns from its own partitions, so its model's sums are W = λI + own + Σ others. It
publishes its *own cumulative* sums (``core.contribution``: everything it has learned itself, not the
increments since its last message), tagged (member, sequence), and applies every other member's
newest one: the member's previous sums out, the new ones in. Why cumulative rather than increments:

- idempotent and order-free: a record older than the one applied, or the same one twice, is skipped by
  its sequence; a lost or aborted record costs latency, never a count (the next one carries it);
- a member that restarts from an older snapshot re-learns what came after it (replay) and its next
  record replaces what the others hold, so nothing is counted twice after a crash, in either mode;
- a joiner needs no separate full state: the newest record of every member is the group's state, and
  a compacted topic (key = member and chunk) keeps exactly those.

The price is memory: every member keeps every other's newest sums (to take them out again), K copies
of L·n(n+1)/2 + L·n·m floats (docs/scaling.md); a member's own sums are W − λI − Σ others.

Forgetting runs on a clock the members share: rows seen *by the group*. A member's clock C is the rows
it saw itself plus, per other member, the rows that member reported in its newest record (``rows``):
applying a record moves the clock on by the rows it adds (``contribution.advance``: every sum decays),
and the record's sums, read at its member's clock C_j, count as 2^(−(C − C_j)/half-life) of themselves.
So every member's state is λI + Σᵢ 2^(−(C − cᵢ)/half-life) dᵢdᵢᵀ over the rows it knows, cᵢ the row's stamp
on the clock of the member that saw it (labels likewise), and once every record has gone round, every
member holds the same C and the same sums: the weighted closed form over all rows.

The warm-up scaler must be the same on every member (the same x must give the same D): a member whose
warm-up rows are in proposes its scaling, and the first proposal in the log is the group's
(``agree_scaling``). Until then its batches are held, as in a single worker's warm-up.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import orjson

from iolstream.core import contribution
from iolstream.core.scaling import Scaler


@dataclass
class MemberSums:
    """The newest sums applied from one other member."""

    seq: int
    sums: dict[str, np.ndarray]
    published_ms: int  # when the member published them (its clock)
    applied_ms: int  # when they were applied here
    rows: int  # rows that member has seen itself (its share of the group clock; never taken back)
    clock: int  # its clock when it published these sums (they are worth 2^(−(C − clock)/half-life) at C)
    label_rows: int = 0  # with auto: labelled rows it scored itself (its share of the selector's clock)
    label_clock: int = 0  # its selector's clock when it published
    rate: float | None = None  # its rows per ms between its last two records (None: one record so far)


class GroupState:
    """One member's view of the group: its own sequence, every other member's newest sums, the scaling.

    member : str — this member's id (stable across restarts: it keys the sequence and the compacted records)
    model  : the EdRVFL whose sums are shared (a restore or a roll-back makes a new GroupState for its model)
    """

    def __init__(self, member: str, model):
        self.member = member
        self.model = model
        self.own_seq = 0  # the last sequence this member published (or found of itself in the log)
        self.published_version: int | None = None  # model version at the last publish (None: nothing yet)
        self.members: dict[str, MemberSums] = {}
        self.scaling_from: str | None = None  # the member whose warm-up scaling the group uses
        self.proposal: dict[str, np.ndarray] | None = None  # this member's, waiting to be published
        self.proposed = False
        self.target_proposal: dict[str, np.ndarray] | None = None  # regression: this member's target scaling
        self.target_proposed = False
        self.handovers = 0  # sequence of this member's handed-over rows records
        self.adopted: tuple | None = (
            None  # (sums, rows, label_rows) of the own record taken back (no snapshot)
        )
        self.counters = {"published": 0, "applied": 0, "skipped": 0, "adopted": 0}

    # ------------------------------------------------------------ own sums
    def own(self) -> dict[str, np.ndarray]:
        """This member's own cumulative sums: W − λI − Σ others (each aged to this clock)."""
        total = contribution.sums(self.model)
        others = self._others()
        return total if others is None else contribution.difference(total, others)

    def own_rows(self) -> int:
        """Rows this member saw itself: its clock less the rows of every other member it holds."""
        return contribution.clock(self.model) - sum(m.rows for m in self.members.values())

    def own_label_rows(self) -> int:
        """Labelled rows this member scored itself (``auto``): its selector's clock less the other members'."""
        return contribution.label_clock(self.model) - sum(m.label_rows for m in self.members.values())

    def _others(self) -> dict[str, np.ndarray] | None:
        now, labels, total = contribution.clock(self.model), contribution.label_clock(self.model), None
        for m in sorted(self.members):
            s = self.members[m]
            aged = contribution.decayed(self.model, s.sums, now - s.clock, labels - s.label_clock)
            total = aged if total is None else _plus(total, aged)
        return total

    def changed(self) -> bool:
        """Whether the model learned something since the last publish."""
        return self.published_version != self.model.version

    def next_record(self) -> tuple[int, dict[str, np.ndarray], dict]:
        """(sequence, own sums, clocks) of the next record; call ``published`` once it is produced. Clocks:
        {"clock", "rows", "label_clock", "label_rows"}: this member's clocks and its own shares of them."""
        clocks = {
            "clock": contribution.clock(self.model),
            "rows": self.own_rows(),
            "label_clock": contribution.label_clock(self.model),
            "label_rows": self.own_label_rows(),
        }
        return self.own_seq + 1, self.own(), clocks

    def published(self, seq: int) -> None:
        self.own_seq = seq
        self.published_version = self.model.version
        self.counters["published"] += 1

    # ------------------------------------------------------------ others
    def apply(
        self,
        member: str,
        seq: int,
        sums: dict[str, np.ndarray],
        *,
        clock: int,
        rows: int,
        published_ms: int,
        now_ms: int,
        label_clock: int = 0,
        label_rows: int = 0,
        adopt_own: bool = False,
    ) -> str:
        """A record read from the log. Returns what was done: "applied" (another member's newer sums replaced its
        older ones here), "stale" (not newer than the one applied: skipped), "own" (this member's: its sequence
        is noted), "adopted" (``adopt_own``, a member starting with no state: its own newest sums become its
        own again, so that a restart without a snapshot does not take back what it contributed)."""
        if member == self.member:
            if seq <= self.own_seq:
                return "stale"
            self.own_seq = seq
            if adopt_own:  # its rows count on the clock again; with forgetting their age is taken from now
                contribution.check_layout(self.model, sums)
                before = self.adopted or ({}, 0, 0)  # a newer own record replaces the one adopted before it
                contribution.advance(self.model, rows - before[1], label_rows - before[2])
                contribution.add(self.model, contribution.difference(sums, before[0] or None))
                self.adopted = ({k: v.copy() for k, v in sums.items()}, rows, label_rows)
                self.published_version = self.model.version
                self.counters["adopted"] += 1
                return "adopted"
            return "own"
        old = self.members.get(member)
        if old is not None and seq <= old.seq:
            self.counters["skipped"] += 1
            return "stale"
        contribution.check_layout(self.model, sums)
        unchanged = (
            self.published_version == self.model.version
        )  # nothing of its own learned since the last publish
        rows = max(
            int(rows), 0 if old is None else old.rows
        )  # a member restarted from an older state re-counts
        label_rows = max(int(label_rows), 0 if old is None else old.label_rows)
        contribution.advance(
            self.model,
            rows - (0 if old is None else old.rows),
            label_rows - (0 if old is None else old.label_rows),
        )  # the group's clocks move on
        now, labels = contribution.clock(self.model), contribution.label_clock(self.model)
        new = contribution.decayed(self.model, sums, now - clock, labels - label_clock)
        before = (
            None
            if old is None
            else contribution.decayed(self.model, old.sums, now - old.clock, labels - old.label_clock)
        )
        contribution.add(self.model, contribution.difference(new, before))
        if unchanged:
            self.published_version = self.model.version
        rate = (
            None
            if old is None or published_ms <= old.published_ms
            else (rows - old.rows) / (published_ms - old.published_ms)
        )
        self.members[member] = MemberSums(
            seq,
            {k: v.copy() for k, v in sums.items()},
            published_ms,
            now_ms,
            rows,
            int(clock),
            label_rows,
            int(label_clock),
            rate,
        )
        self.counters["applied"] += 1
        return "applied"

    # ------------------------------------------------------------ scaling
    def propose_scaling(self, head: np.ndarray) -> None:
        """The processor's warm-up hook (``StreamProcessor.propose_scaling``): ``head`` holds the first W rows
        this member saw; their scaling is proposed to the group once (``proposal``), never frozen here."""
        if self.proposal is not None or self.proposed or self.model.scaler.frozen:
            return
        scaler = self.model.scaler
        mine = Scaler("warmup", scaler.n_features, warmup_rows=scaler.warmup_rows, scaled=scaler.scaled)
        mine.partial_fit(head)
        self.proposal = mine.to_state()

    def agree_scaling(self, member: str, state: dict[str, np.ndarray]) -> bool:
        """The first proposal in the log is the group's: freeze the model's scaler to it (later ones are ignored,
        and so is any once the scaler is frozen). Returns whether it was taken."""
        scaler = self.model.scaler
        if scaler.frozen:
            return False
        proposal = Scaler("warmup", scaler.n_features, warmup_rows=scaler.warmup_rows, scaled=scaler.scaled)
        proposal.load_state(state)  # checked before the model's scaler takes it
        if (
            not proposal.frozen
            or proposal.mean.shape != (scaler.n_features,)
            or proposal.scale.shape != (scaler.n_features,)
        ):
            raise ValueError(
                f"scaling record of {member!r}: not a frozen scaler of {scaler.n_features} features"
            )
        scaler.load_state(state)
        self.scaling_from = member
        self.proposal = None
        return True

    def propose_targets(self, mean: np.ndarray, std: np.ndarray) -> None:
        """The target scaler's warm-up hook (``TargetScaler.propose``): this member's first labels' scaling."""
        if self.target_proposal is None and not self.target_proposed and not self.model.targets.frozen:
            self.target_proposal = {
                "mean": np.asarray(mean, dtype=np.float64),
                "std": np.asarray(std, dtype=np.float64),
            }

    def agree_targets(self, member: str, state: dict[str, np.ndarray]) -> bool:
        """The first target-scaling proposal in the log is the group's: the labels held for it enter now."""
        if self.model.targets.frozen:
            return False
        try:
            self.model.targets.agree(state["mean"], state["std"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"target scaling record of {member!r}: {exc}") from None
        self.target_proposal = None
        self.model.release_held_labels()
        return True

    # ------------------------------------------------------------ status, state
    def status(self, now_ms: int) -> dict:
        """Group size; how far this state is behind the group: per other member, the age of its newest sums
        applied here (ms) and the rows it has likely learned since (its recent rate × that age, an estimate);
        ``sequences``: the sequence of every member's newest sums held here (this member's: its last published)."""
        lag_ms = {m: max(0, now_ms - s.published_ms) for m, s in self.members.items()}
        lag_rows = {m: (0 if s.rate is None else int(s.rate * lag_ms[m])) for m, s in self.members.items()}
        return {
            "members": 1 + len(self.members),
            "member_rows": {m: s.rows for m, s in self.members.items()},
            "lag_ms": lag_ms,
            "lag_rows": lag_rows,
            "own_seq": self.own_seq,
            "sequences": {self.member: self.own_seq, **{m: s.seq for m, s in self.members.items()}},
            **self.counters,
        }

    def to_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(manifest part, arrays) for the snapshot: sequences and every other member's newest sums."""
        manifest = {
            "member": self.member,
            "own_seq": self.own_seq,
            "scaling_from": self.scaling_from,
            "proposed": self.proposed,
            "target_proposed": self.target_proposed,
            "handovers": self.handovers,
            "members": {
                m: [s.seq, s.published_ms, s.rows, s.clock, s.label_rows, s.label_clock]
                for m, s in self.members.items()
            },
            "counters": dict(self.counters),
        }
        arrays = {}
        for index, (m, s) in enumerate(sorted(self.members.items())):
            manifest["members"][m].append(index)
            arrays.update({f"group/{index}/{k}": v for k, v in s.sums.items()})
        return manifest, arrays

    def load_state(self, manifest: dict, arrays: dict[str, np.ndarray], now_ms: int) -> None:
        if manifest["member"] != self.member:
            raise ValueError(
                f"the snapshot is member {manifest['member']!r}'s, this worker is {self.member!r} (group.member_id)"
            )
        self.own_seq = int(manifest["own_seq"])
        self.scaling_from = manifest.get("scaling_from")
        self.proposed = bool(manifest.get("proposed", False))
        self.target_proposed = bool(manifest.get("target_proposed", False))
        self.handovers = int(
            manifest.get("handovers", 0)
        )  # saved since a reused sequence could mix two records' chunks
        self.counters.update(manifest.get("counters", {}))
        self.members = {}
        for m, (seq, published_ms, rows, clock, label_rows, label_clock, index) in manifest[
            "members"
        ].items():
            prefix = f"group/{index}/"
            sums = {k[len(prefix) :]: np.array(v) for k, v in arrays.items() if k.startswith(prefix)}
            self.members[m] = MemberSums(
                int(seq),
                sums,
                int(published_ms),
                now_ms,
                int(rows),
                int(clock),
                int(label_rows),
                int(label_clock),
            )
        self.published_version = (
            None  # published again after a restart: the log may hold an older record of it
        )


class HandedOverLabels:
    """Labels another member held early (they came before their rows), handed over when their partition left it
    (``kafka.group``): they belong to the member that holds their labels partition next — the one that reads
    their rows, rows and labels being keyed alike — and to no other, since a label adopted twice could join two
    copies of a handed-over row. They wait here until this member's assignment says whether the partition is
    its own. Sources are opaque here; ``holds(source)`` says whether this member holds the source's partition."""

    def __init__(self):
        self.waiting: list[
            tuple[str, list[str], np.ndarray, list]
        ] = []  # (from member, ids, labels, sources)

    def __len__(self) -> int:
        return sum(len(ids) for _, ids, _, _ in self.waiting)

    def add(self, member: str, ids: list[str], labels: np.ndarray, sources: list) -> None:
        if ids:
            self.waiting.append((member, list(ids), labels, list(sources)))

    def clear(self) -> None:
        self.waiting = []

    def settle(self, holds, *, assigned: bool) -> tuple[list, list[tuple[str, int]]]:
        """(adopt, let go): the labels of partitions this member holds now, as (member, ids, labels, sources), to
        adopt; and, at an assignment (``assigned``), the count of the others per member: the assignment did not
        give their partition here, so it is another member's. Until an assignment the others wait."""
        adopt, let_go, keep = [], [], []
        for member, ids, labels, sources in self.waiting:
            mine = [i for i, source in enumerate(sources) if holds(source)]
            if mine:
                index = np.array(mine, dtype=np.intp)
                adopt.append((member, [ids[i] for i in mine], labels[index], [sources[i] for i in mine]))
            rest = sorted(set(range(len(ids))) - set(mine))
            if not rest:
                continue
            if assigned:
                let_go.append((member, len(rest)))
            else:
                index = np.array(rest, dtype=np.intp)
                keep.append((member, [ids[i] for i in rest], labels[index], [sources[i] for i in rest]))
        self.waiting = keep
        return adopt, let_go


def _plus(a: dict, b: dict) -> dict:
    return {k: (np.maximum(v, b[k]) if k.endswith(".maxes") else v + b[k]) for k, v in a.items()}


def model_digest(config, candidates: list[tuple] | None = None, modes: list[str] | None = None) -> str:
    """A short digest of what the members must share: the model config and, with ``lam``, ``forgetting`` or
    ``mode: auto``, the candidate grid the model keeps. The grid is not in the config: it is the release's
    (``core.candidates``), and a member restored from a snapshot keeps the one it was saved with
    (``core.state_io``). After a release that changed it, sums of the old grid and the new are laid out alike
    but hold other settings, and must not be added. A fixed config has one candidate, given by the config."""
    described = config.to_dict()
    # which batches the candidates are scored on: the selector's sums of members that score more or fewer add
    # alike (each on its clock of scored rows), so members may differ in it, and a release that adds it changes
    # no digest
    described.pop("scoring_share", None)
    # the coverage emitted: the residual counts behind it add alike whatever it is
    described.pop("interval", None)
    if candidates is not None and len(candidates) > 1:
        described["candidate_grid"] = [[lam, h] for lam, h in candidates]
        if modes is not None and config.mode == "auto":  # -F and -R candidates: each one's mode too
            described["candidate_modes"] = list(modes)
    described = _spelled_once(described)
    return hashlib.sha256(orjson.dumps(described, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _spelled_once(value):
    """``value`` with every whole float as the integer it is: YAML's ``lam: 1`` and ``forgetting: 1000`` are
    ints in a fresh model and floats in one restored from a snapshot (``core.state_io``), the same model.

        >>> _spelled_once({"lam": 1.0, "grid": [[0.5, 1000.0], [5, None]], "flag": True})
        {'lam': 1, 'grid': [[0.5, 1000], [5, None]], 'flag': True}
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _spelled_once(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_spelled_once(v) for v in value]
    return value
