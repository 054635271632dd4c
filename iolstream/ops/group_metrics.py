"""Prometheus families of group learning (``group.enabled``), from the worker view's ``group_status``.

=====================================  ==========  =============================================
name                                   type        labels; meaning
=====================================  ==========  =============================================
group_members                          gauge       members whose sums this state holds, itself included
group_state_lag_seconds                gauge       member: age of its newest sums applied here
group_state_lag_rows                   gauge       member: rows it likely learned since (its rate × that age)
group_records_total                    counter     kind = sums | scaling | targets | rows, direction = out | in | refused
group_bytes_total                      counter     direction = out | in: record bytes (this process)
=====================================  ==========  =============================================
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
