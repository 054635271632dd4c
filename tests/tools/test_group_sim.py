"""The in-process group simulation (tools.group_sim): members that exchange their sums end with the single
worker's sums; independent members do not; rows go to members by their id's hash."""

import numpy as np
import pytest

from iolstream.core import contribution
from iolstream.core.model import ModelConfig
from iolstream.tools.group_sim import final_sums_gap, owners, quality_table, simulate_group


def _stream(rows=1500, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 5))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    return x, y


CFG = ModelConfig(
    n_inputs=5, classes=(0, 1, 2), n_nodes=24, n_layers=2, scaler="none", track_regret=False, seed=3
)


@pytest.mark.parametrize("members", [2, 3])
def test_the_group_ends_with_the_single_workers_sums(members):
    x, y = _stream()
    single = simulate_group(x, y, CFG, members=1, batch_rows=40)
    group = simulate_group(x, y, CFG, members=members, batch_rows=40, sync_rows=120)
    assert group.records_applied >= members * (members - 1)  # at least the last exchange went round
    assert sum(group.member_rows) == len(x) and min(group.member_rows) > 0
    assert final_sums_gap(group, single) < 1e-12
    for m in group.models:  # and so the same predictions as the single worker
        np.testing.assert_array_equal(m.predict(x[:200]), single.models[0].predict(x[:200]))
    alone = simulate_group(x, y, CFG, members=members, batch_rows=40, exchange=False)
    assert alone.records_applied == 0
    assert final_sums_gap(alone, single) > 0.1  # each member holds only its own share
    counts = [int(contribution.sums(m)["p0.counts"][0]) for m in alone.models]
    assert counts == alone.member_rows


def test_rows_go_to_members_by_id_hash():
    got = owners(3000, 3, partitions=6)
    assert set(np.unique(got)) == {0, 1, 2}
    np.testing.assert_array_equal(got, owners(3000, 3, partitions=6))  # stable
    shares = np.bincount(got) / 3000
    assert np.all(np.abs(shares - 1 / 3) < 0.05)
    with pytest.raises(ValueError, match="partitions"):
        owners(10, 3, partitions=2)
    with pytest.raises(ValueError, match="sync_rows"):
        simulate_group(*_stream(100), CFG, members=2, batch_rows=10)


def test_quality_table_reports_the_gap_to_the_single_worker():
    x, y = _stream(900)
    table = quality_table(x, y, CFG, batch_rows=30, sync_rows=60, member_counts=(2,))
    kinds = [(r["kind"], r["members"]) for r in table["runs"]]
    assert kinds == [("group", 2), ("independent", 2)]
    for r in table["runs"]:
        assert r["gap"] == pytest.approx(table["single"]["accuracy"] - r["accuracy"])
    assert table["runs"][0]["final_sums_gap"] < 1e-12


def test_split_batch_cuts_member_batches_of_b_over_k_and_syncs_after_each():
    x, y = _stream(600)
    table = quality_table(x, y, CFG, batch_rows=60, sync_rows=None, member_counts=(3,), split_batch=True)
    group = table["runs"][0]
    assert (group["batch_rows"], group["sync_rows"]) == (20, 20)
    assert group["records_published"] >= sum(
        -(-r // 20) for r in group["member_rows"]
    )  # one per batch at least


def test_projection_runs_out_of_interval_where_merging_fills_it():
    from iolstream.tools.bench_group import projection

    cost = {
        "record_bytes": 1_000_000,
        "build_own_sums_ms": 5.0,
        "encode_ms": 3.0,
        "produce_ms": 2.0,
        "decode_ms": 10.0,
        "apply_ms": 40.0,
        "resolve_ms": 40.0,
        "row_us": 100.0,
    }
    rows = {r["members"]: r for r in projection(cost, members=(1, 4, 20), sync_seconds=1.0)}
    # per interval: publish 10 ms + (K−1)·50 ms merging + 40 ms re-solve; the rest at 10,000 rows/s
    assert rows[4]["sync_share"] == pytest.approx(0.2)
    assert rows[4]["rows_per_second_total"] == pytest.approx(4 * 0.8 * 10_000)
    assert rows[20]["rows_per_second_total"] == 0.0  # 19 × 50 ms + 50 ms: the interval is full
    assert rows[4]["deltas_out_mb_per_s"] == pytest.approx(12.0)  # 4 records, each read by 3 members
    assert rows[1]["members_where_merging_fills_the_interval"] == pytest.approx(1 + 0.95 / 0.05)
