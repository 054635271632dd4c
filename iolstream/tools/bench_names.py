"""What the Kafka benches (``bench --suite kafka`` and ``--suite group``) make on the broker: their names and their
clean-up.

Every topic and consumer group a run makes is named ``PREFIX-<what>-<random hex>``, PREFIX ``bench`` unless
``bench --prefix`` gives another: on a cluster whose ACLs grant topics and groups by prefix, give that prefix (a run
needs Create, Describe, Write, Read and Delete on its topics and Read on its groups), and two runs sharing a broker
can each find what is theirs. A run deletes its topics at its end (``delete_topics``).
"""

from __future__ import annotations

import re
import sys
import uuid

from confluent_kafka import KafkaError, KafkaException

from iolstream.kafka import clients

DEFAULT_PREFIX = "bench"
_VALID = re.compile(
    r"[A-Za-z0-9._-]{1,120}"
)  # Kafka's topic-name characters, room left for the rest of a name


class Names:
    """The names of one run: ``name("read")`` → ``PREFIX-read-1f2e3d4c``; ``created`` keeps the topics handed
    out by ``topic`` for ``delete_topics``."""

    def __init__(self, prefix: str = DEFAULT_PREFIX):
        if not _VALID.fullmatch(prefix):
            raise ValueError(
                f"--prefix {prefix!r}: a topic and group name prefix takes 1-120 of the characters "
                "letters, digits, '.', '_' and '-'"
            )
        self.prefix = prefix
        self.created: list[str] = []

    def name(self, *parts: str, random: int = 8) -> str:
        """A consumer group's (or another unlisted) name: PREFIX-parts…-<random hex>."""
        return "-".join([self.prefix, *parts, uuid.uuid4().hex[:random]])

    def topic(self, *parts: str) -> str:
        """A topic's name, PREFIX-parts… (a random part among ``parts`` keeps it the run's own), listed in
        ``created``."""
        name = "-".join([self.prefix, *parts])
        self.created.append(name)
        return name


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete a run's topics (a kafka run leaves ~20 with up to 50 MB of data otherwise, and a broker that gathered
    thousands of them spends a core's share on them in the background); one never created (no dead letters) is
    no failure, the others are printed as a warning."""
    if not names:
        return
    admin = clients.admin({"bootstrap.servers": bootstrap})  # kept referenced until the futures are done
    futures = admin.delete_topics(names, operation_timeout=30)
    failed = []
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                failed.append(f"{name}: {exc.args[0].str()}")
    if failed:
        print(f"warning: could not delete {len(failed)} bench topics: {failed[:3]}", file=sys.stderr)
