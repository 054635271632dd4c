"""``iolstream bench --suite kafka`` end to end on the real broker, at a tiny scale and at two modes side by
side: every number is there, consistent with the others, and the worker processed every row. Nothing here is timed
(benchmarks report ratios; they are never asserted against a clock)."""

from __future__ import annotations

import json
import os
import time

import pytest
from confluent_kafka.admin import AdminClient

from iolstream.tools import bench_names, cli


def assert_no_topics_left(admin: AdminClient, prefix: str) -> None:
    """No topic of the run's ``prefix`` left on the broker (its deletions are done; the metadata may trail them a
    moment)."""

    def left() -> set[str]:
        return {t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + "-")}

    deadline = time.monotonic() + 15
    while (names := left()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not names, f"the bench left its topics behind: {sorted(names)[:4]}"


@pytest.mark.timeout(1200)  # two modes, eight worker processes: a busy 2-core machine took over 300 s
def test_kafka_suite_runs_end_to_end(kafka_bootstrap, capsys):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    prefix = f"test-bench-{os.getpid()}"  # its own: another bench may share the broker
    code = cli.main(
        [
            "bench",
            "--prefix",
            prefix,
            "--suite",
            "kafka",
            "--configs",
            "small",
            "--kafka-scale",
            "0.02",
            "--modes",
            "auto",
            "forward",
            "--json",
            "--bootstrap",
            kafka_bootstrap,
        ]
    )
    assert code == 0
    assert_no_topics_left(admin, prefix)
    groups = admin.list_consumer_groups().result(timeout=30).valid
    assert any(g.group_id.startswith(prefix + "-worker-") for g in groups), (
        "the workers' groups take the prefix"
    )
    out = json.loads(capsys.readouterr().out)
    small = out["results"]["small"]
    batch, rows = small["worker_batch_messages"], small["worker_row_messages"]
    assert batch["rows"] == 2400 and rows["rows"] == 1024  # one prediction per row, read back from the topic
    for value in (
        small["learner_rows_per_second"],
        small["processor_rows_per_second"],
        batch["rows_per_second"],
        rows["rows_per_second"],
        small["river_softmax_rows_per_second"],
    ):
        assert value > 0
    for run in (batch, rows):  # CPU over the timed rows; at this scale a window of a few clock ticks
        assert 0 <= run["cpu_seconds_per_100k_rows"] < 1e4 and 0 <= run["cores_used"] < 1e3
    assert small["worker_vs_learner"] == pytest.approx(
        batch["rows_per_second"] / small["learner_rows_per_second"]
    )
    assert small["worker_vs_river"] == pytest.approx(
        batch["rows_per_second"] / small["river_softmax_rows_per_second"]
    )
    assert small["batch_vs_row_messages"] == pytest.approx(batch["rows_per_second"] / rows["rows_per_second"])
    latency = small["latency_at_half_max"]
    assert latency["rate_rows_per_second"] == pytest.approx(batch["rows_per_second"] / 2)
    # 20 s of paced stream at this scale (0.4 s), every row's prediction read back
    assert latency["rows"] == max(int(latency["rate_rows_per_second"] * 20 * 0.02), 4 * 256)
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    memory = small["peak_rss_mb_by_rows"]
    assert list(memory) == ["2000", "20000"] and all(50 < mb < 4096 for mb in memory.values())
    # the worker at each mode, side by side: the top level is the first mode's
    assert small["mode"] == "auto" and list(small["by_mode"]) == ["auto", "forward"]
    auto, forward = small["by_mode"]["auto"], small["by_mode"]["forward"]
    assert auto["worker_batch_messages"] == batch
    assert forward["worker_batch_messages"]["rows"] == 2400 and forward["worker_row_messages"]["rows"] == 1024
    for messages, key in (
        ("batch_messages", "worker_batch_messages"),
        ("row_messages", "worker_row_messages"),
    ):
        assert auto["worker_cost_vs_forward"][messages] == pytest.approx(
            forward[key]["rows_per_second"] / auto[key]["rows_per_second"]
        )
    assert forward["worker_vs_river"] == pytest.approx(
        forward["worker_batch_messages"]["rows_per_second"] / small["river_softmax_rows_per_second"]
    )


def test_worker_cpu_is_read_over_the_timed_window_only():
    """CPU seconds between two wall-clock times, interpolated in the 20 ms samples (start-up and the
    idle tail before and after the timed predictions are left out)."""
    from iolstream.tools.bench_kafka import WorkerProcess

    w = WorkerProcess.__new__(WorkerProcess)  # the samples alone, no process
    w.cpu_samples = [(100.0, 1.5), (101.0, 1.5), (102.0, 3.0), (103.0, 4.5), (104.0, 4.6)]
    assert w.cpu_between(101.0, 103.0) == pytest.approx(3.0)
    assert w.cpu_between(101.5, 102.5) == pytest.approx(1.5)
    w.cpu_samples = [(100.0, 1.0)]
    assert w.cpu_between(100.0, 101.0) != w.cpu_between(100.0, 101.0)  # NaN: nothing to read it from


def test_group_suite_runs_end_to_end(kafka_bootstrap, capsys):
    """``bench --suite group`` at a tiny scale: both runs predict every row, the sync costs match the record
    formula, the projection follows from them; the quality table is group_sim's (tests/tools/test_group_sim.py)."""
    prefix = f"test-bench-group-{os.getpid()}"
    code = cli.main(
        [
            "bench",
            "--suite",
            "group",
            "--group-rows",
            "2048",
            "--no-group-quality",
            "--json",
            "--bootstrap",
            kafka_bootstrap,
            "--prefix",
            prefix,
        ]
    )
    assert code == 0
    assert_no_topics_left(AdminClient({"bootstrap.servers": kafka_bootstrap}), prefix)
    out = json.loads(capsys.readouterr().out)
    tp = out["throughput"]
    assert tp["cpu_count"] == os.cpu_count() and tp["partitions"] == 4
    for key, workers in (("w1", 1), ("w2", 2)):
        assert (
            tp[key]["workers"] == workers
            and tp[key]["rows_predicted"] >= 2048
            and tp[key]["rows_per_second"] > 0
        )
        assert len(tp[key]["peak_rss_mb"]) == workers
    assert tp["ratio_vs_one_worker"] == pytest.approx(
        tp["w2"]["rows_per_second"] / tp["w1"]["rows_per_second"]
    )
    costs = {c["config"]: c for c in out["sync_costs"]}
    for name, n in (("default", 523), ("poker", 1000)):
        c = costs[name]
        assert c["n_columns"] == n and c["formula_bytes"] <= c["record_bytes"] < c["formula_bytes"] * 1.01
        assert all(
            c[k] > 0 for k in ("encode_ms", "produce_ms", "decode_ms", "apply_ms", "resolve_ms", "row_us")
        )
    assert [p["members"] for p in out["projection"]["default"]] == [4, 16, 64]
    assert "quality" not in out


def test_the_names_a_bench_makes_take_its_prefix_and_a_prefix_kafka_would_refuse_is_named():
    names = bench_names.Names("team-a.perf")
    topic = names.topic("small", "batch", "features")
    assert topic == "team-a.perf-small-batch-features" and names.created == [topic]
    group = names.name("read")
    assert group.startswith("team-a.perf-read-") and len(group) == len("team-a.perf-read-") + 8
    assert names.name("read") != group and names.created == [topic]  # a group is not a topic to delete
    for bad in ("", "team a", "team/a", "x" * 121):
        with pytest.raises(ValueError, match="--prefix"):
            bench_names.Names(bad)
