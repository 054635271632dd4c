"""The group-learning metric families (ops.group_metrics) from a worker's group status."""

from prometheus_client import CollectorRegistry, generate_latest

from iolstream.ops.group_metrics import group_families


class _Collector:
    def __init__(self, status):
        self.status = status

    def collect(self):
        yield from group_families(self.status)


def _scrape(status) -> str:
    registry = CollectorRegistry()
    registry.register(_Collector(status))
    return generate_latest(registry).decode()


def test_group_families_report_size_lag_records_bytes_and_what_is_held():
    status = {
        "members": 3,
        "lag_ms": {"m1": 1500, "m2": 200},
        "lag_rows": {"m1": 300, "m2": 40},
        "records": {"sums/out": 7, "sums/in": 12, "rows/in": 1},
        "bytes_out": 1000,
        "bytes_in": 2000,
        "sequences": {"m0": 9, "m1": 4, "m2": 11},
        "log_positions": {0: 321},
        "unpublished": True,
    }
    text = _scrape(status)
    assert "iolstream_group_members 3.0" in text
    assert 'iolstream_group_state_lag_seconds{member="m1"} 1.5' in text
    assert 'iolstream_group_state_lag_rows{member="m2"} 40.0' in text
    assert 'iolstream_group_records_total{direction="in",kind="sums"} 12.0' in text
    assert 'iolstream_group_bytes_total{direction="out"} 1000.0' in text
    assert 'iolstream_group_sequence{member="m1"} 4.0' in text
    assert 'iolstream_group_log_position{partition="0"} 321.0' in text
    assert "iolstream_group_unpublished 1.0" in text
    assert "iolstream_group_unpublished 0.0" in _scrape({**status, "unpublished": False})


def test_nothing_without_group_learning():
    assert _scrape(None) == ""
