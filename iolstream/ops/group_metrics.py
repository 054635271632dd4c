"""Prometheus families of group learning (``group.enabled``), from the worker view's ``group_status``.

=====================================  ==========  =============================================
name                                   type        labels; meaning
=====================================  ==========  =============================================
group_members                          gauge       members whose sums this state holds, itself included
group_state_lag_seconds                gauge       member: age of its newest sums applied here
group_state_lag_rows                   gauge       member: rows it likely learned since (its rate × that age)
group_records_total                    counter     kind = sums | scaling | targets | rows, direction = out | in | refused
group_bytes_total                      counter     direction = out | in: record bytes (this process)
group_sequence                         gauge       member: sequence of its newest sums held here (this member's: its last published)
group_log_position                     gauge       partition: offset of the model-deltas topic read to (every record below is applied)
group_unpublished                      gauge       1 while this member holds input not learned yet, or sums learned since its last record
=====================================  ==========  =============================================

A group is settled when every member's ``group_unpublished`` is 0 and every member holds every member's newest
sequence: then each holds the same sums (docs/scaling.md).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "iolstream_group_"


def group_families(status: dict | None):
    """The families above (nothing when group learning is off)."""
    if not status:
        return
    members = GaugeMetricFamily(PREFIX + "members", "Members whose sums this state holds, itself included")
    members.add_metric([], status["members"])
    yield members
    lag_s = GaugeMetricFamily(
        PREFIX + "state_lag_seconds", "Age of each member's newest sums applied here", labels=["member"]
    )
    lag_rows = GaugeMetricFamily(
        PREFIX + "state_lag_rows",
        "Rows each member likely learned since its newest sums applied here (its recent rate × their age)",
        labels=["member"],
    )
    for member, ms in sorted(status["lag_ms"].items()):
        lag_s.add_metric([member], ms / 1000.0)
        lag_rows.add_metric([member], status["lag_rows"][member])
    yield lag_s
    yield lag_rows
    records = CounterMetricFamily(
        PREFIX + "records", "Group records produced (out) and taken (in)", labels=["kind", "direction"]
    )
    for key, n in sorted(status["records"].items()):  # "kind/direction"
        records.add_metric(key.split("/"), n)
    yield records
    data = CounterMetricFamily(
        PREFIX + "bytes", "Group record bytes produced (out) and read (in)", labels=["direction"]
    )
    data.add_metric(["out"], status["bytes_out"])
    data.add_metric(["in"], status["bytes_in"])
    yield data
    sequence = GaugeMetricFamily(
        PREFIX + "sequence",
        "Sequence of each member's newest sums held here (this member's own: the last it published)",
        labels=["member"],
    )
    for member, seq in sorted(status["sequences"].items()):
        sequence.add_metric([member], seq)
    yield sequence
    position = GaugeMetricFamily(
        PREFIX + "log_position",
        "Offset of the model-deltas topic this member has read to: every record below it is applied",
        labels=["partition"],
    )
    for partition, offset in sorted(status["log_positions"].items()):
        position.add_metric([str(partition)], offset)
    yield position
    yield GaugeMetricFamily(
        PREFIX + "unpublished",
        "1 while this member holds input it has not learned yet, or sums it learned since its last record",
        value=1 if status["unpublished"] else 0,
    )
