"""Group learning over Kafka: the members of one consumer group share their sums (docs/scaling.md).

The bookkeeping is ``stream.group.GroupState``; this module moves its records through the
``topics.model_deltas`` topic (one partition, compacted, created at start):

- **publish** every ``group.sync_every_ms``, and before every checkpoint (so at a revoke and at shutdown):
  this member's own cumulative sums as one record, tagged (member, sequence), with the input positions
  it covers; produced with the worker's producer, so under exactly-once in the transaction that holds
  the input offsets. A record larger than ``group.chunk_bytes`` goes as chunks (keys
  ``<member>/sums/<i>``), reassembled by (member, sequence) and checked (size, SHA-256 of the whole);
- **read** every cycle, with its own consumer (``read_committed``, assigned the topic's partitions,
  outside the input group): other members' newest sums replace their older ones in the model; this
  member's own records tell it its last sequence after a restart;
- **start**: read the log to its end first; a member with no snapshot takes its own newest record back
  (sums and the input positions they cover) and its last handover of waiting rows, so that a restart
  without a snapshot neither drops nor repeats what it contributed;
- **handover**: before partitions go (a revoke, a stop, and at a restart: they may have moved meanwhile), the
  rows waiting for labels, for every member, and the labels waiting for rows of the partitions that go, for
  the member that holds their partition next (``kafka.handover``);
- **stop**: once its last record is committed, a stopping member reads the log to the end it has then, for up
  to the call timeout, so that its final snapshot holds every record published before the stop; what it could
  not read in time is noted in the snapshot (``stop``) and read first at the next start (docs/scaling.md);
- **forget requests passed on** (``stream.forwarding``): a member asked to forget an id it never saw (or holds
  only a handed-over copy of) asks the members whose sums it holds (``ask``); each answers with the ids its
  retention store holds (``answer``); the
  member holding a row takes it out on reading its own answer back; the asking member refuses what nobody
  holds on reading the last answer, or its own ``close`` (published after ``group.forward_wait_ms``). Every
  decision is taken on reading this log (``read_forwarding``); the records go out with the worker's producer
  (exactly-once: in the open transaction) at the cycle's end and before a checkpoint (``forward``);
- **scaling**: a member's warm-up rows give a proposal (keys ``<member>/scaling/<i>``), produced at once by a
  producer of its own, outside any transaction (a proposal is never wrong, only possibly not the first);
  the first in the log is the group's scaler, on every member. Before partitions go (``settle``), a
  member whose rows still wait for that agreement reads the proposals published so far (its own among them),
  then learns them; without one, it learns them once the agreement comes and hands them over then.

The processor proposes its warm-up scaling to this object (``stream.scaler_warmup.ScalingAgreement``, given to
the processor when it is made, ``kafka.resume``). Records as Kafka messages (chunks, headers, keys):
``kafka.group_records``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from iolstream.kafka import message_limits, snapshots, topics
from iolstream.kafka.clients import client_conf
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.group_records import EACH_KEPT, Reassembly, chunked
from iolstream.kafka.handover import Handovers
from iolstream.ops.faults import crash_point
from iolstream.stream.group import GroupState, model_digest

log = logging.getLogger("iolstream.group")

HANDOVER_SKEW_MS = 10_000  # a handover published this long before a member started reading still counts


class GroupSync:
    """The group side of one worker: its records in and out, and the scaling agreement its processor proposes
    to. ``attach`` gives it the processor and the group state of the snapshot loaded (at start, and after a
    roll-back the processor of the snapshot it went back to); ``open`` makes the consumer; then ``catch_up``
    once, ``poll`` every cycle, ``publish`` when due (``kafka.participant`` calls them at the worker's moments)."""

    def __init__(self, cfg, output, *, assigned=frozenset):
        self.cfg = cfg
        self.gc = cfg.group
        self.member = cfg.member_id
        self.topic = cfg.topics.model_deltas
        self.output = output
        self.state: GroupState | None = None
        self.consumer: Consumer | None = None
        self.proposer: Producer | None = None  # warm-up scaling proposals, outside any transaction
        self.positions: dict[int, int] = {}  # deltas partition -> next offset to read (in snapshots)
        self.chunks = Reassembly()  # the chunks of records read so far (kafka.group_records)
        self.caught_up = False
        self.restored = False  # a snapshot was loaded: no adoption of this member's own record
        self.adopted_positions: dict | None = None  # input positions of an adopted own record
        # no snapshot: what its own last handover held, taken back with its sums once caught up
        self.own_rows: tuple | None = None  # (ids, payload) of the rows
        self.own_labels: dict | None = None  # the record's arrays, for the labels
        self.last_publish_ms = 0
        self.bytes_out = self.bytes_in = 0
        self.refused: set = (
            set()
        )  # (member, model digest) of records of another model config, logged once each
        self.records: Counter = Counter()  # (kind, "out" | "in") -> records this process produced / took
        self.partitions: set[int] = set()
        self.eof: set[int] = set()
        self.start_ends: dict[int, int] = {}  # deltas partition -> its end when the consumer was assigned
        self.started_ms = 0
        self.model_digest = model_digest(cfg.model)
        self.handovers = Handovers(self._produce, assigned)  # rows and labels whose partitions moved
        # at a stop (``complete``): partition -> (read to, end; -1 if the end could not be had)
        self.stop_reached: dict[int, tuple[int, int]] | None = None

    # ------------------------------------------------------------ state
    def attach(self, processor, saved: tuple[dict, dict] | None, *, start: bool = False) -> None:
        """Bind to ``processor``'s model, with the group state of the snapshot it came from (None: fresh).
        Only at ``start`` may a fresh state take this member's own newest record back (a roll-back to no
        snapshot replays the input from its beginning instead)."""
        self.state = GroupState(self.member, processor.model)
        self.processor = processor
        self.handovers.attach(processor, self.state)
        processor.erasure.forwarding.bind(
            self.member, lambda: list(self.state.members), self.gc.forward_wait_ms
        )
        self.model_digest = model_digest(
            processor.model.config, processor.model.candidates, processor.model.modes
        )
        self.restored = saved is not None or not start
        self.own_rows = self.own_labels = self.adopted_positions = None
        if saved is not None:
            manifest, arrays = saved
            self.state.load_state(manifest, arrays, _now_ms())
            self.positions = {int(p): int(o) for p, o in manifest.get("positions", [])}
            behind = (manifest.get("stop") or {}).get("behind")
            if behind and start:
                log.info(
                    "the snapshot lacks records of the model-deltas topic published before its stop (partition, "
                    "from, to: %s): reading them first",
                    behind,
                )
        else:
            self.positions = {}
        self.chunks.clear()
        if self.consumer is not None:
            self._seek()

    def to_state(self) -> tuple[dict, dict]:
        """The group state and the deltas positions to resume from: before the first chunk of any record read
        in part (a snapshot between two chunks must not skip the first ones; records read again are stale)."""
        manifest, arrays = self.state.to_state()
        positions = dict(self.positions)
        for partition, offset in self.chunks.first_offsets():
            positions[partition] = min(positions.get(partition, offset), offset)
        manifest["positions"] = sorted([p, o] for p, o in positions.items())
        if self.stop_reached is not None:  # a graceful stop: the end it read to, and what it could not read
            manifest["stop"] = {
                "ends": sorted([p, end] for p, (_, end) in self.stop_reached.items()),
                "behind": sorted(
                    [p, read, end] for p, (read, end) in self.stop_reached.items() if read < end
                ),
            }
        return manifest, arrays

    # ------------------------------------------------------------ the consumer
    def open(self) -> None:
        """Create the model-deltas topic if asked, and the consumer and proposal producer of this member."""
        if self.cfg.topics.create:
            admin = AdminClient(client_conf(self.cfg))
            created = topics.create_topics(
                admin,
                [self.topic],
                partitions=1,
                replication_factor=self.cfg.topics.replication_factor,
                configs={self.topic: topics.delta_topic_config(self.gc.chunk_bytes)},
            )
            if created:
                log.info("created the model-deltas topic %s", self.topic)
        conf = {
            **client_conf(self.cfg),
            "group.id": f"{self.cfg.kafka.group_id}.deltas.{self.member}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.max.bytes": max(52428800, self.gc.chunk_bytes + message_limits.DELTA_HEADROOM),
            "receive.message.max.bytes": max(
                100000000,
                self.gc.chunk_bytes + message_limits.DELTA_HEADROOM + message_limits.RECEIVE_OVERHEAD,
            ),
        }
        self.consumer = Consumer(conf)
        self.proposer = Producer({**client_conf(self.cfg), "enable.idempotence": True, "acks": "all"})
        self._seek()

    def _seek(self) -> None:
        until = time.monotonic() + self.cfg.kafka.call_timeout_seconds
        while (
            True
        ):  # a topic just created (by this member or another) may take a moment to show in the metadata
            meta = self.consumer.list_topics(
                self.topic, timeout=self.cfg.kafka.call_timeout_seconds
            ).topics.get(self.topic)
            if meta is not None and meta.error is None and meta.partitions:
                break
            if time.monotonic() >= until:
                raise WorkerError(
                    f"topics.model_deltas: topic {self.topic!r} cannot be read ({meta and meta.error})"
                )
            time.sleep(0.2)
        self.consumer.assign(
            [TopicPartition(self.topic, p, self.positions.get(p, OFFSET_BEGINNING)) for p in meta.partitions]
        )
        self.partitions = set(meta.partitions)
        self.caught_up = False
        self.eof = set()
        # caught up: at the end the log had now (not at an end-of-partition event: while other members
        # publish, every fetch brings new records and that event may not come for as long as they do)
        timeout = self.cfg.kafka.call_timeout_seconds
        self.start_ends = {
            p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout)[1]
            for p in meta.partitions
        }
        self.started_ms = (
            self.started_ms or _now_ms()
        )  # a roll-back re-reads the handovers since its snapshot

    def catch_up(self, timeout: float, tick=lambda: None) -> None:
        """Read the log to the end it had when the consumer was assigned, before the input is consumed."""
        until = time.monotonic() + timeout
        while not self.caught_up and time.monotonic() < until:
            self.poll(max_messages=500, timeout=0.2)
            tick()
        if not self.caught_up:
            log.warning(
                "the model-deltas topic %s was not read to its end within %.0f s: going on (this member "
                "publishes once it is)",
                self.topic,
                timeout,
            )

    def poll(self, max_messages: int = 200, timeout: float = 0.0) -> int:
        """Apply what the deltas consumer has fetched; returns how many records were complete."""
        done = 0
        for msg in self.consumer.consume(num_messages=max_messages, timeout=timeout):
            if (err := msg.error()) is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.eof.add(msg.partition())
                elif err.fatal():
                    raise WorkerError(f"model-deltas consumer: {err.str()}")
                else:
                    log.warning("model-deltas consumer: %s", err)
                continue
            self.positions[msg.partition()] = msg.offset() + 1
            self.eof.discard(msg.partition())
            self.bytes_in += len(msg.value() or b"")
            done += self._take(msg)
        if not self.caught_up and self._at_start_ends():
            self.caught_up = True
            if self.own_rows is not None:
                self.handovers.adopt_rows(self.member, *self.own_rows)
                self.own_rows = None
            if self.own_labels is not None:
                self.handovers.receive_labels(self.member, self.own_labels)
                self.own_labels = None
        self._propose()
        return done

    def _at_start_ends(self) -> bool:
        """Every partition read to the end it had when the consumer was assigned (or to an end-of-partition
        event)."""
        behind = [p for p in self.partitions if p not in self.eof and self.start_ends.get(p, 0) > 0]
        return not behind or all(read >= self.start_ends[p] for p, read in self._read_to(behind).items())

    def _read_to(self, partitions) -> dict[int, int]:
        """partition -> the offset up to which the consumer has read it (every record below is taken). The
        consumer's position steps over transaction markers, which the last record's offset does not."""
        positions = self.consumer.position([TopicPartition(self.topic, p) for p in partitions])
        return {tp.partition: max(tp.offset, self.positions.get(tp.partition, 0)) for tp in positions}

    def _propose(self) -> None:
        """This member's warm-up proposals waiting (``GroupState.propose_scaling``, ``propose_targets``):
        produce them now, once each, with the proposals' own producer (outside any transaction)."""
        st = self.state
        if not self.caught_up:
            return
        if st.proposal is not None and not st.proposed:
            self._publish_proposal("scaling", st.proposal)
            st.proposed = True
        if st.target_proposal is not None and not st.target_proposed:
            self._publish_proposal("targets", st.target_proposal)
            st.target_proposed = True

    def _publish_proposal(self, kind: str, arrays: dict) -> None:
        self._produce(kind, 0, {"published_ms": _now_ms()}, arrays, producer=self.proposer)
        self.proposer.flush(self.cfg.kafka.call_timeout_seconds)

    # ------------------------------------------------------------ the processor's scaling agreement
    def propose_scaling(self, head: np.ndarray) -> None:
        """The processor's warm-up rows (``stream.scaler_warmup.ScalingAgreement``): proposed to the group."""
        self.state.propose_scaling(head)

    def propose_targets(self, mean: np.ndarray, std: np.ndarray) -> None:
        """The model's target scaling (regression, ``target_scaler: warmup``): proposed to the group."""
        self.state.propose_targets(mean, std)

    def complete(self, timeout: float, tick=lambda: None) -> bool:
        """A graceful stop, once this member's last record is committed (``kafka.commit``): read the log to the end
        it has now, for up to ``timeout`` s, so that the final snapshot holds every record published before the
        stop. Labels handed over meanwhile are left to the members that take the partitions. What could not be
        read in time is noted in the snapshot (``stop``) and read first at the next start, as every start reads
        on from the snapshot's positions. Returns whether the end was reached."""
        self.handovers.stop()
        if self.consumer is None:  # stopped before the log was opened: nothing read, nothing to say
            return False
        ends = self._ends(timeout)
        if ends is None:  # the snapshot says so
            self.stop_reached = {p: (self.positions.get(p, 0), -1) for p in sorted(self.partitions)}
            return False
        until = time.monotonic() + timeout
        read = self._read_to(ends)
        while any(read[p] < end for p, end in ends.items()) and time.monotonic() < until:
            self.poll(timeout=0.1)
            tick()
            read = self._read_to(ends)
        self.stop_reached = {p: (read[p], end) for p, end in ends.items()}
        behind = {p: (read[p], end) for p, end in ends.items() if read[p] < end}
        if behind:
            log.warning(
                "the model-deltas topic was not read to its end at the stop within %.0f s (partition: read to, end "
                "%s): the snapshot says so, and the next start reads them first",
                timeout,
                behind,
                extra={"event": "group_stop_behind"},
            )
        else:
            log.info(
                "read the model-deltas topic to its end at the stop (%s): the final snapshot holds every record "
                "published before it (%s)",
                ends,
                ", ".join(f"{m}#{seq}" for m, seq in sorted(self.state.status(0)["sequences"].items())),
                extra={"event": "group_stop_complete"},
            )
        return not behind

    def settle(self, timeout: float, tick=lambda: None) -> None:
        """Partitions are about to go: wait for the group's warm-up scaling (rows held for it can then be learned)
        only as long as it takes to read the records published before now, this member's own proposal among them,
        and at most ``timeout`` s: the whole rebalance waits with it. Rows still held are learned once it comes and
        handed over then (``GroupMember.handover_owed``); what still waits is logged."""
        until = time.monotonic() + timeout
        model = self.processor.model

        def waiting() -> bool:
            return bool(
                (self.processor.held and not model.ready) or (model.targets.held and not model.targets.frozen)
            )

        def say(why: str) -> None:
            log.warning(
                "%d rows and %d labels still wait for the group's scaling: %s; they are learned once it comes (the "
                "rows handed over then)",
                self.processor.held_rows,
                sum(len(h[1]) for h in model.targets.held),
                why,
            )

        ends = None
        while waiting() and time.monotonic() < until:
            self.poll(timeout=0.1)  # publishes its own proposal once the log is read to its ends at the start
            tick()
            if ends is None and self.caught_up:  # its own proposal, if any, is in the log now (flushed)
                ends = self._ends(until - time.monotonic())
            if ends is not None and all(r >= ends[p] for p, r in self._read_to(ends).items()):
                if waiting():
                    say(
                        "every proposal published before this revoke is read, and none made it (the group has "
                        "too few rows yet)"
                    )
                return
        if waiting():
            say(f"not agreed within {timeout:.0f} s")

    def _ends(self, timeout: float) -> dict[int, int] | None:
        """partition -> the log's end now (None if the broker does not say within ``timeout`` s)."""
        try:
            return {
                p: self.consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=max(0.5, timeout), cached=False
                )[1]
                for p in sorted(self.partitions)
            }
        except KafkaException as exc:
            log.warning("the model-deltas topic's end is unknown (%s)", exc)
            return None

    def _take(self, msg) -> int:
        """One message of the topic: a record once its last chunk is read, applied (1) or refused (0)."""
        record = self.chunks.add(msg)
        if record is None:
            return 0
        kind, member, seq, blob = record.kind, record.member, record.seq, record.blob
        self.records[(kind, "in")] += 1
        if not record.intact:
            log.warning(
                "model-deltas: record %s#%d is %d bytes, its header says %d: skipped",
                member,
                seq,
                len(blob),
                record.size,
            )
            return 0
        try:
            manifest, arrays = snapshots.decode(blob)
        except snapshots.SnapshotError as exc:
            log.warning("model-deltas: record %s#%d cannot be read (%s): skipped", member, seq, exc)
            return 0
        if manifest.get("model") != self.model_digest:
            # Sums of another model config cannot be added. Not fatal: the compacted topic keeps a record of
            # every member that ever published, and a group redeployed with a new model section would read the
            # old ones for ever (a model change needs a new topics.model_deltas, docs/operations.md).
            return self._refuse(
                kind, member, manifest.get("model"), "another model config or auto candidate grid"
            )
        # a record the model cannot take changes nothing (the checks come before any change) and stops nothing
        try:
            return self._apply(kind, member, seq, manifest, arrays)
        except (KeyError, TypeError, ValueError) as exc:
            return self._refuse(kind, member, manifest.get("model"), f"a record that does not load ({exc!r})")

    def _apply(self, kind: str, member: str, seq: int, manifest: dict, arrays: dict) -> int:
        if kind == "scaling":
            if self.state.agree_scaling(member, arrays):
                log.info(
                    "the group's warm-up scaling is member %s's", member, extra={"event": "group_scaling"}
                )
            return 1
        if kind == "targets":
            if self.state.agree_targets(member, arrays):
                log.info(
                    "the group's target scaling is member %s's", member, extra={"event": "group_scaling"}
                )
            return 1
        if kind in EACH_KEPT:
            return self.read_forwarding(kind, member, manifest)
        published_ms = int(manifest["published_ms"])
        if kind == "rows":
            rows = (arrays["ids"], arrays["payload"])
            if member == self.member:  # its own: a restart without a snapshot goes on with the next sequence
                self.state.handovers = max(self.state.handovers, seq)
            # Handovers are for the members of the rebalance that made them: one published before this member
            # started reading (10 s of clock skew allowed) is older than its membership, except its own last
            # one when it takes its own sums back (no snapshot): the rows it was waiting on, adopted once
            # caught up. Its own labels come back to it if their partition does: they left its state.
            current = published_ms >= self.started_ms - HANDOVER_SKEW_MS
            if member != self.member and current:
                self.handovers.adopt_rows(member, *rows)
            elif member == self.member and not self.caught_up and self.adopted_positions is not None:
                self.own_rows = rows
            if member == self.member and not self.restored and not self.caught_up:
                # no snapshot: only the labels of its handover after the sums it takes back
                if self.adopted_positions is not None:
                    self.own_labels = arrays
            elif member == self.member or current:
                self.handovers.receive_labels(member, arrays)
            return 1
        adopt = not self.restored and not self.caught_up
        clocks = {k: int(manifest[k]) for k in ("clock", "rows", "label_clock", "label_rows")}
        positions = {(str(t), int(p)): int(o) for t, p, o in manifest["positions"]}
        what = self.state.apply(
            member, seq, arrays, **clocks, published_ms=published_ms, now_ms=_now_ms(), adopt_own=adopt
        )
        if what == "adopted":
            self.own_rows = self.own_labels = None  # what it handed over before this record is older than it
            self.adopted_positions = positions
            log.info(
                "no snapshot: took back this member's own sums #%d (input up to %s)",
                seq,
                manifest["positions"],
                extra={"event": "group_adopted"},
            )
        return 1

    def read_forwarding(self, kind: str, member: str, manifest: dict) -> int:
        """An ask, answer or close read: decided here (``stream.forwarding``), acted on by the processor."""
        proc = self.processor
        decision = proc.erasure.forwarding.read(kind, member, manifest["body"], proc.erasure.holds, _now_ms())
        if decision.remove:
            crash_point("before_forward_removal")  # test-only: its answer on the log, the row not out yet
        if decision.refuse:
            crash_point("before_forward_refusal")  # test-only: the ask decided, the refusal not held yet
        if decision.remove or decision.refuse:
            log.info(
                "forget request %s passed on: %d ids taken out here, %d refused (no member holds them)",
                decision.source,
                len(decision.remove),
                len(decision.refuse),
                extra={"event": "forget_forwarded"},
            )
        proc.forward_decided(decision, _now_ms())
        return 1

    def forward(self, *, replaying: bool) -> None:
        """Publish the asks, answers and closes waiting (``stream.forwarding``); mid-replay (exactly-once) the
        asks of input a committed transaction covered are on the log already and are not published again."""
        if not self.caught_up:
            return
        forwarding = self.processor.erasure.forwarding
        forwarding.overdue(_now_ms())
        for kind, body in forwarding.take_outbox(asks=not replaying):
            seq = int(body["number"])
            self._produce(kind, seq, {"published_ms": _now_ms(), "body": body}, {})

    def _refuse(self, kind: str, member: str, model: str | None, why: str) -> int:
        """Skip a record this model cannot take: counted as refused, logged once per (member, model
        digest)."""
        self.records[(kind, "refused")] += 1
        if (member, model) not in self.refused:
            self.refused.add((member, model))
            log.error(
                "model-deltas: member %s publishes %s of %s (model digest %s, this member's %s): skipped; every "
                "member of a group must run the same model section and candidate grid",
                member,
                kind,
                why,
                model,
                self.model_digest,
                extra={"event": "group_refused"},
            )
        return 0

    # ------------------------------------------------------------ publishing
    def due(self, now_ms: int) -> bool:
        """Whether this member's sums are due for publishing (``group.sync_every_ms``)."""
        return now_ms - self.last_publish_ms >= self.gc.sync_every_ms

    def publish(self, positions: dict, *, force: bool = False) -> bool:
        """Produce this member's own sums if due (or ``force``) and changed, and a scaling proposal if one
        waits; never before the log was read to its end (the sequence would be unknown). Returns whether
        produced."""
        now = _now_ms()
        if not self.caught_up or (not force and not self.due(now)):
            return False
        st = self.state
        if not st.changed():
            self.last_publish_ms = now
            return False
        seq, sums, clock = st.next_record()
        manifest = {
            "published_ms": now,
            "positions": [[t, p, o] for (t, p), o in sorted(positions.items())],
            **clock,
        }
        self._produce("sums", seq, manifest, sums)
        st.published(seq)
        self.last_publish_ms = now
        return True

    def hand_over(self, partitions=None) -> None:
        """Before partitions go (a revoke, a stop, a restart): what this member waits on (``kafka.handover``)."""
        self.handovers.hand_over(partitions)

    def assignment_changed(self) -> None:
        """The input consumer's assignment changed: handed-over labels find their member (``kafka.handover``)."""
        self.handovers.assignment_changed()

    def _produce(self, kind: str, seq: int, manifest: dict, arrays: dict, producer=None) -> None:
        manifest = {**manifest, "kind": kind, "member": self.member, "seq": seq, "model": self.model_digest}
        blob = snapshots.encode(manifest, arrays)
        # the worker's producer (exactly-once: in the open transaction), or the proposals' own
        produce = self.output.produce if producer is None else producer.produce
        for key, chunk, headers in chunked(self.member, kind, seq, blob, self.gc.chunk_bytes):
            produce(self.topic, chunk, key=key, headers=headers, partition=0)
        self.bytes_out += len(blob)
        self.records[(kind, "out")] += 1

    def status(self) -> dict:
        """The group state for the status line and the metrics (``ops.group_metrics``)."""
        out = self.state.status(_now_ms())
        out.update(
            {
                "bytes_out": self.bytes_out,
                "bytes_in": self.bytes_in,
                "caught_up": self.caught_up,
                "log_positions": self._read_to(self.partitions) if self.consumer is not None else {},
                # it holds input it has not learned, or learned sums it has not published
                "unpublished": bool(self.state.changed() or self.processor.unlearned),
                "records": {f"{kind}/{direction}": n for (kind, direction), n in self.records.items()},
            }
        )
        return out

    def close(self) -> None:
        """Flush the proposals, close the deltas consumer."""
        if self.proposer is not None:
            self.proposer.flush(1.0)
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            try:
                consumer.close()
            except (KafkaException, RuntimeError):
                pass


def _now_ms() -> int:
    return int(time.time() * 1000)
