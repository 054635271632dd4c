"""Forget requests passed on in a group (docs/design.md §13, "A group"): the request goes to the record.

A member that gets a request for an id it never saw, while other members share its model, does not refuse
it at once: the row may have been learned by another member before a rebalance moved its partition here, and
only that member's retention store holds what it takes to remove it. It *asks* the group on the model-deltas
topic, whose one partition every member reads in the same order; every decision is taken on reading that
log, never on input:

- ``ask`` (the asking member, a number of its own; the ids, the request's source, the members asked — those
  whose sums it holds): each member asked answers once, on reading it;
- ``answer`` (the member, the ask, the ids its store holds): for each id, the first answer holding it decides:
  that member takes the row out of its own sums on reading its own answer back, and its receipt names the
  original request. The answers of every member asked read, the ids none holds are refused by the asking
  member (``forget_unknown_id``);
- ``close`` (the asking member, the ask): published once the members it waits for have not all answered
  within ``group.forward_wait_ms``; on reading it, the ids still undecided are refused. An answer read after
  the close decides nothing (the member that sent it leaves the row).

A row handed over at a rebalance while waiting for its label (``kafka.handover``) has its Gram in the sums of
the member that predicted it and, once labelled, its label's term in the sums of the member that joined the
label, whose retention record holds both (that member taking both out leaves the group's sum exact). A member
holding only a *copy* of such a row — the one that handed it over (``gram``: its Gram is in this member's sums),
or one that adopted it and saw no label (``bare``: nothing of it in its sums) — does not take it out alone: it
asks, with its copies named. An answer lists the ids its store holds whole (``ids``) and the handed-over copies
whose Gram is in its sums (``copies``). The first answer holding an id whole decides it; once every member
answered (or at the close) an id nobody holds whole goes to the holder of its Gram: the asking member if its
copy is ``gram``, else the first answer naming it a copy; an id nobody holds is refused. The asking member drops
its copy (no sums change) when another member took the row out.

A record read twice (a member restarted from a snapshot reads the log again from the snapshot's positions, an
at-least-once restart publishes an ask or an answer again) decides nothing the first did not: asks are known
by (member, number), and an id is decided once. The state below is in the member's snapshot, beside the
log's positions, so a restart takes the same decisions again. No Kafka here: ``kafka.group`` moves the
records, the processor removes and refuses (``Decision``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

ASK, ANSWER, CLOSE = "ask", "answer", "close"  # the records' kinds on the model-deltas topic
REMEMBER_DECIDED = 100_000  # asks decided remembered, so that a record of one read again decides nothing


def ask_key(member: str, number: int) -> str:
    """The name of a member's ask: ``<member>#<number>``."""
    return f"{member}#{int(number)}"


@dataclass
class Ask:
    """An ask read from the log and not decided for every id yet.

    member, number : who asked, its number; ids : the ids asked about; source : the original request's
    source ([topic, partition, offset]); asked : the members it waits for; read_ms : when it was read here
    (the asking member's wait runs from then); answered : the members whose answer was read; decided : id ->
    the member removing it ("" : refused); closing : the asking member published its close.
    """

    member: str
    number: int
    ids: list[str]
    source: list
    asked: list[str]
    read_ms: int
    answered: list[str] = field(default_factory=list)
    decided: dict[str, str] = field(default_factory=dict)
    closing: bool = False
    copies: dict[str, str] = field(default_factory=dict)
    gram: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return ask_key(self.member, self.number)

    def undecided(self) -> list[str]:
        return [i for i in self.ids if i not in self.decided]

    def to_state(self) -> dict:
        return {
            "member": self.member,
            "number": self.number,
            "ids": list(self.ids),
            "source": list(self.source),
            "asked": list(self.asked),
            "read_ms": self.read_ms,
            "answered": list(self.answered),
            "decided": dict(self.decided),
            "closing": self.closing,
            "copies": dict(self.copies),
            "gram": dict(self.gram),
        }


@dataclass
class Decision:
    """What reading one record decided for this member: ``remove`` ids it takes out of its own sums,
    ``refuse`` ids it refuses (it asked), ``drop`` ids of its copies another member took out (it asked: the
    copy goes, its sums stay), each list with the original request's ``source``."""

    source: list | None = None
    remove: list[str] = field(default_factory=list)
    refuse: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)


class Forwarding:
    """One member's asks, answers and closes (module docstring). ``bind`` names the member and how to learn
    who else shares its model; unbound (a single worker) it asks nothing and an unknown id is refused at once.

    wait_ms : how long the asking member waits for the answers before it closes an ask
    """

    def __init__(self, wait_ms: int = 30_000):
        self.wait_ms = wait_ms
        self.member: str | None = None
        self.peers = lambda: []  # the other members whose sums this one holds
        self.next_number = 0  # this member's next ask
        self.next_reply = 0  # this member's next answer or close (each record has a number of its kind)
        self.outbox: list[tuple[str, dict]] = []  # (kind, body) records to publish, in order
        self.asks: dict[str, Ask] = {}  # read from the log, not decided yet, by key
        self.decided: OrderedDict[str, None] = OrderedDict()  # asks decided (the newest REMEMBER_DECIDED)
        self.answered: OrderedDict[str, None] = OrderedDict()  # asks this member answered
        # the requests this member asked about ([topic, partition, offset] -> ids): a request read again (an
        # at-least-once replay; its decision may be read from the log before it) asks nothing and does nothing
        self.requests: OrderedDict[str, list[str]] = OrderedDict()
        self.counters = {
            "asks_sent": 0,  # asks this member published (ids it did not know, passed on)
            "asks_answered": 0,  # answers this member published to other members' asks
            "asks_closed": 0,  # closes this member published (answers missing after the wait)
            "ids_removed_for_others": 0,  # ids this member removed on another member's ask
            "ids_refused_after_ask": 0,  # ids this member refused once its ask was decided
        }

    def bind(self, member: str, peers, wait_ms: int) -> None:
        """Group learning: this member's name; ``peers()`` the other members whose sums it holds now; the
        wait for answers (``group.forward_wait_ms``)."""
        self.member, self.peers, self.wait_ms = member, peers, wait_ms

    def others(self) -> list[str]:
        """The members an ask goes to now (none: a single worker, or alone in its group)."""
        if self.member is None:
            return []
        return sorted(m for m in self.peers() if m != self.member)

    # ------------------------------------------------------------ out
    def not_asked(self, ids: list[str], source) -> list[str]:
        """The ids of ``ids`` this member did not ask about for the request from ``source`` already."""
        asked = self.requests.get(_request_key(source))
        return ids if not asked else [i for i in ids if i not in set(asked)]

    def _asked(self, source, ids: list[str]) -> None:
        key = _request_key(source)
        self.requests[key] = sorted(set(self.requests.get(key, [])) | set(ids))
        self.requests.move_to_end(key)
        while len(self.requests) > REMEMBER_DECIDED:
            self.requests.popitem(last=False)

    def ask(self, ids: list[str], source, copies: dict[str, str] | None = None) -> bool:
        """Ask the other members about ``ids`` (ids this member never saw, or holds only a copy of: ``copies``,
        id -> "gram" | "bare") for the request from ``source``. Returns False when there is nobody to ask (then
        the caller refuses them, or takes its copies out, at once)."""
        asked = self.others()
        if not ids or not asked:
            return False
        body = {
            "number": self.next_number,
            "ids": list(ids),
            "source": _jsonable(source),
            "asked": asked,
            "copies": dict(copies or {}),
        }
        self.next_number += 1
        self.outbox.append((ASK, body))
        self._asked(body["source"], body["ids"])
        return True

    def take_outbox(self, *, asks: bool = True) -> list[tuple[str, dict]]:
        """The records to publish now, in order; ``asks`` False drops the asks (made again by input that a
        committed transaction already covered, whose asks are on the log already)."""
        out, self.outbox = self.outbox, []
        if not asks:
            out = [(kind, body) for kind, body in out if kind != ASK]
        for kind, _ in out:
            if kind == ASK:
                self.counters["asks_sent"] += 1
            elif kind == ANSWER:
                self.counters["asks_answered"] += 1
            elif kind == CLOSE:
                self.counters["asks_closed"] += 1
        return out

    def overdue(self, now_ms: int) -> None:
        """Close this member's asks whose answers did not all come within ``wait_ms`` of reading the ask."""
        for a in self.asks.values():
            if a.member == self.member and not a.closing and now_ms - a.read_ms >= self.wait_ms:
                a.closing = True
                self.outbox.append((CLOSE, {"ask": a.key, "number": self._reply()}))

    def _reply(self) -> int:
        self.next_reply += 1
        return self.next_reply - 1

    def waiting(self) -> int:
        """Asks read and not decided yet."""
        return len(self.asks)

    # ------------------------------------------------------------ in: every decision is taken here
    def read(self, kind: str, member: str, body: dict, holds, now_ms: int) -> Decision:
        """One record of the log. ``holds(ids)``: (the ids of ``ids`` whose row this member holds whole, those it
        holds as a handed-over copy whose Gram is in its sums). Returns what it decided for this member."""
        if kind == ASK:
            return self._ask(member, body, holds, now_ms)
        a = self.asks.get(str(body["ask"]))
        if a is None:  # decided already, or older than what this member keeps: decides nothing
            return Decision()
        if kind == ANSWER:
            return self._answer(a, member, [str(i) for i in body["ids"]], [str(i) for i in body["copies"]])
        if kind == CLOSE and member == a.member:
            return self._settle(a, Decision(source=a.source))
        return Decision()

    def _ask(self, member: str, body: dict, holds, now_ms: int) -> Decision:
        a = Ask(
            member=member,
            number=int(body["number"]),
            ids=[str(i) for i in body["ids"]],
            source=list(body["source"]),
            asked=[str(m) for m in body["asked"]],
            read_ms=now_ms,
            copies={str(k): str(v) for k, v in body.get("copies", {}).items()},
        )
        if a.key in self.asks or a.key in self.decided:  # published twice: the first one counts
            return Decision()
        self.asks[a.key] = a
        if member == self.member:  # (read again after a restart from a snapshot older than the ask)
            self._asked(a.source, a.ids)
        if self.member in a.asked and member != self.member and a.key not in self.answered:
            whole, copies = holds(a.ids)
            body = {"ask": a.key, "ids": list(whole), "copies": list(copies), "number": self._reply()}
            self.outbox.append((ANSWER, body))
            _remember(self.answered, a.key)
        return Decision()

    def _answer(self, a: Ask, member: str, whole: list[str], copies: list[str]) -> Decision:
        if member not in a.asked or member in a.answered:
            return Decision()
        a.answered.append(member)
        out = Decision(source=a.source)
        for row_id in whole:
            if row_id in a.ids and row_id not in a.decided:
                a.decided[row_id] = member
                if member == self.member:
                    out.remove.append(row_id)
        for row_id in copies:
            if row_id in a.ids:
                a.gram.setdefault(row_id, member)
        if set(a.answered) >= set(a.asked) or not a.undecided():
            return self._settle(a, out)
        self.counters["ids_removed_for_others"] += len(out.remove)
        return out

    def _settle(self, a: Ask, out: Decision) -> Decision:
        """The ask decided for every id: an id nobody holds whole goes to the holder of its Gram (the asking
        member's own copy first), else it is refused (by the asking member); the asking member drops its copies
        of the rows another member took out."""
        me = self.member
        for row_id in a.undecided():
            holder = a.member if a.copies.get(row_id) == "gram" else a.gram.get(row_id, "")
            a.decided[row_id] = holder
            if holder and holder == me:
                out.remove.append(row_id)
            elif not holder and a.member == me:
                out.refuse.append(row_id)
        if a.member == me:
            out.drop = [i for i in a.copies if a.decided.get(i) != me]
        self.counters["ids_removed_for_others"] += sum(a.member != me for _ in out.remove)
        self.counters["ids_refused_after_ask"] += len(out.refuse)
        del self.asks[a.key]
        _remember(self.decided, a.key)
        return out

    # ------------------------------------------------------------ the snapshot
    def to_state(self) -> dict:
        """Asks waiting, the records not published yet, the asks decided and answered, the counters."""
        return {
            "next_number": self.next_number,
            "next_reply": self.next_reply,
            "asks": [a.to_state() for a in self.asks.values()],
            "outbox": [[kind, body] for kind, body in self.outbox],
            "decided": list(self.decided),
            "answered": list(self.answered),
            "requests": [[k, v] for k, v in self.requests.items()],
            "counters": dict(self.counters),
        }

    def load_state(self, state: dict | None) -> None:
        """Back from ``to_state`` (None: nothing asked yet)."""
        state = state or {}
        self.next_number = int(state.get("next_number", 0))
        self.next_reply = int(state.get("next_reply", 0))
        self.asks = {}
        for s in state.get("asks", []):
            a = Ask(**{**s, "answered": list(s["answered"]), "decided": dict(s["decided"])})
            self.asks[a.key] = a
        self.outbox = [(str(kind), dict(body)) for kind, body in state.get("outbox", [])]
        self.decided = OrderedDict.fromkeys(state.get("decided", []))
        self.answered = OrderedDict.fromkeys(state.get("answered", []))
        self.requests = OrderedDict((str(k), [str(i) for i in v]) for k, v in state.get("requests", []))
        self.counters.update(state.get("counters", {}))


def _remember(keys: OrderedDict, key: str) -> None:
    keys[key] = None
    while len(keys) > REMEMBER_DECIDED:
        keys.popitem(last=False)


def _jsonable(source) -> list:
    """A request's source as JSON holds it: [topic, partition, offset] (a key after them is the id)."""
    if isinstance(source, (tuple, list)):
        return [v if isinstance(v, (str, int)) else str(v) for v in list(source)[:3]]
    return [] if source is None else [str(source)]


def _request_key(source) -> str:
    return "/".join(str(v) for v in _jsonable(source))
