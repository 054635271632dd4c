"""Group learning's bookkeeping without Kafka (stream.group, core.contribution): members that exchange their
cumulative sums hold the model of one learner that saw every row, and the closed-form solution."""

import numpy as np
import pytest

from iolstream.core import contribution
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.stream.group import GroupState

CLASSES = (0, 1, 2)


def _config(**kw):
    base = dict(n_inputs=5, classes=CLASSES, n_nodes=24, n_layers=2, scaler="none", seed=3)
    base.update(kw)
    return ModelConfig(**base)


def _data(rows=1200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 5))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    return x, y


def _feed(model, x, y, batch):
    """-F with labels one batch late; returns every row's stamp (the clock right after its batch was seen)."""
    pending, stamps = None, []
    for start in range(0, len(x), batch):
        pred = model.observe(x[start : start + batch])
        stamps += [pred.clock] * len(pred.features_t[0, 0])
        if pending is not None:
            p, ys = pending
            model.learn(p.features_t, model.encode_labels(ys), predicted=p.predicted, observed_at=p.clock)
        pending = (pred, y[start : start + batch])
    p, ys = pending
    model.learn(p.features_t, model.encode_labels(ys), predicted=p.predicted, observed_at=p.clock)
    return stamps


def _assert_closed_form(model, ln, x, y, w):
    """``ln``'s β of every layer against the weighted ridge solved directly: A = λI + Σ wᵢdᵢdᵢᵀ, c = Σ wᵢdᵢyᵢ."""
    for ls, layer_d in zip(ln.state.layers, model.features(x)):
        a = ls.lam * np.eye(layer_d.shape[0]) + (layer_d * w) @ layer_d.T
        c = (layer_d * w) @ model.encode_labels(y)
        np.testing.assert_allclose(ls.beta, np.linalg.solve(a, c), rtol=1e-7, atol=1e-9)


def _pair(rows: int):
    """Data of ``rows`` rows and two members "a" and "b" of one model config: x, y, cfg, (a, b), (sa, sb)."""
    x, y = _data(rows)
    cfg = _config()
    a, b = EdRVFL(cfg), EdRVFL(cfg)
    return x, y, cfg, (a, b), (GroupState("a", a), GroupState("b", b))


def _publish(state):
    """(seq, sums, clocks) of ``state``'s next record, marked published."""
    seq, sums, clocks = state.next_record()
    state.published(seq)
    return seq, sums, clocks


def _exchange(states, rounds_ms):
    """Every member publishes its own sums; every other applies them (all orders of arrival are fine)."""
    records = []
    for st in states:
        records.append((st.member, *_publish(st)))
    for st in states:
        for member, seq, sums, clock in reversed(records):
            st.apply(member, seq, sums, **clock, published_ms=rounds_ms, now_ms=rounds_ms)


@pytest.mark.parametrize("mode", ["forward", "ridge", "auto"])
@pytest.mark.parametrize("lam", [0.5, "auto"])
def test_members_hold_the_single_learners_sums_and_the_closed_form(mode, lam):
    x, y = _data()
    cfg = _config(mode=mode, lam=lam)
    single = EdRVFL(cfg)
    _feed(single, x, y, batch=50)
    members = [EdRVFL(cfg) for _ in range(3)]
    states = [GroupState(f"m{i}", m) for i, m in enumerate(members)]
    for round_ in range(4):  # four syncs, each member learning its share of rows in between
        for i, m in enumerate(members):
            part = np.arange(len(x))[i::3]
            chunk = part[round_ * len(part) // 4 : (round_ + 1) * len(part) // 4]
            _feed(m, x[chunk], y[chunk], batch=40)
        _exchange(states, 1000 * round_)
    want = contribution.sums(single)
    for m in members:
        got = contribution.sums(m)
        for key in want:
            if key.endswith((".maxes", ".loss")) or key.startswith(
                ("sel.", "cal.")
            ):  # the prequential history differs:
                continue  # other β predicted the rows
            keep = (  # not label_batches: a count of fold-ins
                [0, 1, 2, 4] if key.endswith(".counts") and key.startswith("p") else slice(None)
            )
            np.testing.assert_allclose(got[key][keep], want[key][keep], rtol=1e-9, atol=1e-9, err_msg=key)
        _assert_closed_form(m, m.learner, x, y, np.ones(len(x)))  # A = λI + Σ DᵀD over all rows
        features_t = single.features(x)  # every candidate predicts what the single learner's would
        for a, b in zip(m.learners, single.learners):
            np.testing.assert_allclose(a.layer_outputs(features_t), b.layer_outputs(features_t), atol=1e-9)
        if (
            m.selector.chosen == single.selector.chosen
        ):  # which one is in force follows the prequential history
            np.testing.assert_array_equal(m.predict(x), single.predict(x))


def test_a_record_applied_twice_or_out_of_order_counts_once():
    x, y, cfg, (a, b), (sa, sb) = _pair(600)
    _feed(a, x[:300], y[:300], 30)
    seq1, sums1, clock1 = _publish(sa)
    _feed(a, x[300:], y[300:], 30)
    seq2, sums2, clock2 = _publish(sa)
    assert sb.apply("a", seq2, sums2, **clock2, published_ms=2, now_ms=2) == "applied"
    assert sb.apply("a", seq1, sums1, **clock1, published_ms=1, now_ms=3) == "stale"  # older: skipped
    assert (
        sb.apply("a", seq2, sums2, **clock2, published_ms=2, now_ms=3) == "stale"
    )  # the same again: skipped
    for key, want in contribution.sums(a).items():
        np.testing.assert_allclose(contribution.sums(b)[key], want, rtol=1e-12, atol=1e-12, err_msg=key)
    assert sb.own()["p0.counts"][0] == 0  # b learned nothing itself
    assert sb.status(5)["members"] == 2


def test_a_member_restarted_from_an_older_state_replaces_its_sums_not_adds_them():
    x, y, cfg, (a, b), (sa, sb) = _pair(900)
    _feed(a, x[:300], y[:300], 30)
    seq, sums, clock = _publish(sa)
    old_manifest, old_arrays = sa.to_state()  # "snapshot" at seq 1
    _feed(a, x[300:600], y[300:600], 30)
    seq, sums, clock = _publish(sa)
    sb.apply("a", seq, sums, **clock, published_ms=2, now_ms=2)  # b holds a's rows 0..600
    # a crashes and restarts from its snapshot (rows 0..300), re-learns 300..600 (the replay) and goes on
    a2 = EdRVFL(cfg)
    _feed(a2, x[:300], y[:300], 30)
    sa2 = GroupState("a", a2)
    sa2.load_state(old_manifest, old_arrays, 3)
    assert (
        sa2.apply("a", 2, sums, **clock, published_ms=2, now_ms=3) == "own"
    )  # its own newest record, from the log
    _feed(a2, x[300:900], y[300:900], 30)
    seq, sums, clock = _publish(sa2)
    assert seq == 3
    sb.apply("a", seq, sums, **clock, published_ms=4, now_ms=4)
    single = EdRVFL(cfg)
    _feed(single, x[:300], y[:300], 30)
    _feed(single, x[300:900], y[300:900], 30)
    for key, want in contribution.sums(single).items():
        if not key.endswith((".maxes", ".loss", ".counts")):
            np.testing.assert_allclose(contribution.sums(b)[key], want, rtol=1e-9, atol=1e-9, err_msg=key)


def test_snapshot_round_trip_keeps_the_others_sums():
    x, y, cfg, (a, b), (sa, sb) = _pair(400)
    _feed(a, x[:200], y[:200], 20)
    _feed(b, x[200:], y[200:], 20)
    _exchange([sa, sb], 1)
    manifest, arrays = sb.to_state()
    restored = GroupState("b", b)
    restored.load_state(manifest, arrays, 2)
    assert restored.members["a"].seq == 1 and restored.own_seq == 1
    for key, want in sb.own().items():
        np.testing.assert_allclose(restored.own()[key], want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="member 'b'"):
        GroupState("c", b).load_state(manifest, arrays, 2)


def test_scaling_first_proposal_wins_and_held_rows_wait_for_it():
    from iolstream.stream.config import StreamConfig
    from iolstream.stream.processor import StreamProcessor

    cfg = _config(scaler="warmup", warmup_rows=20)
    model = EdRVFL(cfg)
    state = GroupState("a", model)
    proc = StreamProcessor(model, StreamConfig(batch_rows=10, max_batch_latency_ms=10), agreement=state)
    rng = np.random.default_rng(1)
    for i in range(3):
        rows = [{"id": f"r{i}-{j}", "x": rng.standard_normal(5).tolist()} for j in range(10)]
        for r in rows:
            import orjson

            proc.on_features(orjson.dumps(r), "src", now_ms=0)
        assert proc.step(now_ms=0).rows_predicted == 0  # held: the group has not agreed on a scaling
    assert state.proposal is not None and not model.scaler.frozen
    other = {
        "count": np.array(20),
        "sum": np.zeros(5),
        "sumsq_dev": np.full(5, 19.0),
        "mean": np.ones(5),
        "scale": np.full(5, 2.0),
        "frozen": np.array(True),
    }
    assert state.agree_scaling("b", other)  # another member's proposal came first in the log
    assert not state.agree_scaling("a", state.proposal or other)  # later ones are ignored
    assert state.proposal is None and state.scaling_from == "b"
    np.testing.assert_array_equal(model.scaler.mean, np.ones(5))
    assert proc.step(now_ms=100).rows_predicted == 30  # the held batches go out


def test_regression_labels_wait_for_the_groups_target_scaling():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 5))
    y = 50.0 + 10.0 * x[:, 0] + rng.standard_normal(400)
    cfg = ModelConfig(n_inputs=5, n_nodes=16, n_layers=2, scaler="none", warmup_rows=100)
    a, b = EdRVFL(cfg), EdRVFL(cfg)
    sa, sb = GroupState("a", a), GroupState("b", b)
    a.targets.propose, b.targets.propose = sa.propose_targets, sb.propose_targets
    for model, rows in ((a, slice(0, 200)), (b, slice(200, 400))):
        for start in range(rows.start, rows.stop, 50):
            pred = model.observe(x[start : start + 50])
            model.learn(
                pred.features_t, y[start : start + 50, None], predicted=pred.predicted, observed_at=pred.clock
            )
    assert not a.targets.frozen and a.targets.held and sa.target_proposal is not None  # proposed, not frozen
    assert contribution.sums(a)["p0.counts"][1] == 0  # no label in c yet
    first = sb.target_proposal
    assert sb.agree_targets("b", first) and sa.agree_targets("b", first)  # b's came first in the log
    assert not sa.agree_targets("a", {"mean": np.zeros(1), "std": np.ones(1)})  # a later one is ignored
    np.testing.assert_array_equal(a.targets.mean, b.targets.mean)
    assert not a.targets.held and contribution.sums(a)["p0.counts"][1] == 200  # the held labels entered
    _exchange([sa, sb], 1)
    np.testing.assert_allclose(contribution.sums(a)["p0.rhs"], contribution.sums(b)["p0.rhs"], rtol=1e-9)


@pytest.mark.parametrize("forgetting", [400.0, "auto"])
def test_forgetting_members_agree_on_the_group_clock_and_the_weighted_closed_form(forgetting):
    """Decay on the group's clock (rows seen by all members): after the last exchange every member holds the same
    clock and sums, λI + Σ 2^(−(C − cᵢ)/h) dᵢdᵢᵀ with cᵢ each row's stamp on the clock of the member that saw it."""
    x, y = _data(1500, seed=4)
    cfg = _config(forgetting=forgetting)
    members = [EdRVFL(cfg) for _ in range(3)]
    states = [GroupState(f"m{i}", m) for i, m in enumerate(members)]
    stamps = np.zeros(len(x))
    for round_ in range(5):  # members learn at different paces between syncs
        for i, m in enumerate(members):
            part = np.arange(len(x))[i::3]
            chunk = part[round_ * len(part) // 5 : (round_ + 1) * len(part) // 5]
            stamps[chunk] = _feed(m, x[chunk], y[chunk], batch=20 + 10 * i)
        _exchange(states, round_)
    _exchange(states, 9)  # a second round: every member now holds every other's last sums at the same clock
    clock = members[0].learners[0].state.clock
    assert all(m.learners[0].state.clock == clock == len(x) for m in members)
    for m in (
        members[1:] if len(members[0].learners) > 1 else []
    ):  # auto: one selector for the group (its sums
        # labelled rows every candidate predicted
        scored = sum(member.scoring.scored_rows for member in members)
        assert m.selector.clock == members[0].selector.clock == scored > 0  # on the clock of scored rows)
        for key in ("sel.loss", "sel.pair", "sel.rows"):
            np.testing.assert_allclose(
                contribution.sums(m)[key], contribution.sums(members[0])[key], rtol=1e-9, atol=1e-12
            )
    for p in range(len(contribution.primaries(members[0]))):
        for m in members[1:]:
            for key in ("gram", "rhs", "labelled"):
                np.testing.assert_allclose(
                    contribution.sums(m)[f"p{p}.{key}"],
                    contribution.sums(members[0])[f"p{p}.{key}"],
                    rtol=1e-9,
                    atol=1e-9,
                    err_msg=f"p{p}.{key}",
                )
        ln = contribution.primaries(members[0])[p]
        w = np.ones(len(x)) if ln.half_life is None else np.exp2(-(clock - stamps) / ln.half_life)
        _assert_closed_form(members[0], ln, x, y, w)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"lam": "auto", "forgetting": "auto"},
        {"mode": "ridge"},
        {"mode": "auto", "track_regret": False},
        {"track_regret": False},
    ],
)
def test_layout_names_every_key_and_shape_of_the_sums(kw):
    model = EdRVFL(_config(**kw))
    assert contribution.layout(model) == {key: value.shape for key, value in contribution.sums(model).items()}
    with pytest.raises(ValueError, match="p0.rhs"):
        contribution.check_layout(model, {**contribution.sums(model), "p0.rhs": np.zeros((1, 1, 1))})


@pytest.mark.parametrize("kw", [{"mode": "forward"}, {"mode": "auto", "lam": "auto"}, {"forgetting": 400.0}])
def test_a_row_one_member_forgets_leaves_every_member_through_its_published_sums(kw):
    """Forget on request in a group of two (docs/design.md §13): each member takes rows it learned out of its own
    sums (``EdRVFL.erase``) and publishes its cumulative sums without them; once the records went round, both
    hold the same sums, and without forgetting the closed form of the rows not forgotten (with forgetting,
    each row left at its weight on the group's clock: tests/core/test_erase.py checks that weight)."""
    x, y = _data(1200)
    cfg = _config(**kw)
    members = [EdRVFL(cfg), EdRVFL(cfg)]
    states = [GroupState(m, model) for m, model in zip("ab", members)]
    parts = [np.arange(len(x))[i::2] for i in range(2)]
    stamps = [np.zeros(len(x)), np.zeros(len(x))]
    for round_ in range(3):  # each member learns a third of its rows, then the sums go round
        for i, model in enumerate(members):
            chunk = parts[i][round_ * 200 : (round_ + 1) * 200]
            stamps[i][chunk] = _feed(model, x[chunk], y[chunk], batch=40)
        _exchange(states, 1000 * round_)
    rng = np.random.default_rng(5)
    gone = [np.sort(rng.choice(parts[i], 120, replace=False)) for i in range(2)]  # 20 % of each one's rows
    for i, model in enumerate(members):  # each takes out rows it learned itself, at their stamps
        rows = gone[i]
        model.erase(
            model.features(x[rows]), model.encode_labels(y[rows]), np.ones(len(rows), bool), stamps[i][rows]
        )
    _exchange(states, 5000)
    kept = np.setdiff1d(np.arange(len(x)), np.concatenate(gone))
    for i, model in enumerate(members):
        st = model.learners[0].state
        assert (st.rows_observed, st.rows_labelled) == (len(kept), len(kept)), f"member {'ab'[i]}"
        if cfg.forgetting is None:
            for ln in model.learners[:1]:
                _assert_closed_form(model, ln, x[kept], y[kept], np.ones(len(kept)))
    for key, want in contribution.sums(members[0]).items():
        if key.endswith((".maxes", ".loss")) or key.startswith("sel."):
            continue
        got = contribution.sums(members[1])[key]
        keep = [0, 1, 2, 4] if key.endswith(".counts") and not key.startswith("cls.") else slice(None)
        np.testing.assert_allclose(got[keep], want[keep], rtol=1e-9, atol=1e-9, err_msg=key)


@pytest.mark.parametrize("forgetting", [None, 400.0])
def test_members_agree_on_the_calibration_and_the_class_counts(forgetting):
    """The calibration's sums and the class counts are sums like c: once every record has gone round, every member
    holds the total of what each learned itself, so all map the same scores to the same probabilities."""
    x, y = _data()
    cfg = _config(mode="auto", forgetting=forgetting, class_weight="balanced")
    members = [EdRVFL(cfg) for _ in range(3)]
    states = [GroupState(f"m{i}", m) for i, m in enumerate(members)]
    for round_ in range(3):
        for i, m in enumerate(members):
            part = np.arange(len(x))[i::3]
            chunk = part[round_ * len(part) // 3 : (round_ + 1) * len(part) // 3]
            _feed(m, x[chunk], y[chunk], batch=40)
        _exchange(states, 1000 * round_)
    for st in states:
        own = st.own()
        assert own["cal.sums"].any() and own["cls.counts"].sum() > 0
    first = members[0]
    np.testing.assert_array_equal(first.class_counts, np.bincount(y, minlength=first.config.m))
    for m in members[1:]:
        np.testing.assert_array_equal(m.class_counts, first.class_counts)
        for a, b in zip(m.learners, first.learners):
            np.testing.assert_allclose(a.calibration_sums, b.calibration_sums, rtol=1e-9)
        assert m.selector.chosen == first.selector.chosen
        np.testing.assert_allclose(
            m.predict_batch(x[:50]).proba, first.predict_batch(x[:50]).proba, rtol=1e-7
        )


@pytest.mark.parametrize("settings", [{"lam": 1}, {"forgetting": 1000}, {"lam": 1, "forgetting": 1000.0}])
def test_a_member_restored_from_its_snapshot_has_the_digest_it_had(settings):
    """YAML's ``lam: 1`` or ``forgetting: 1000`` is an int in a fresh model and a float in one restored from a
    snapshot: the same model, one digest (it was another after any restart, and the group split in two models,
    each member skipping the other's sums)."""
    from iolstream.stream.config import StreamConfig
    from iolstream.stream.group import model_digest
    from iolstream.stream.processor import StreamProcessor

    def digest(model):
        return model_digest(model.config, model.candidates, model.modes)

    fresh = StreamProcessor(
        EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, **settings)), StreamConfig()
    )
    restored = StreamProcessor.from_state(*fresh.to_state(), StreamConfig())
    assert digest(restored.model) == digest(fresh.model)
    spelled = {k: float(v) for k, v in settings.items()}  # 1.0 and 1000.0 in another member's YAML
    assert digest(EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, **spelled))) == digest(
        fresh.model
    )
    other = EdRVFL(ModelConfig(n_inputs=3, classes=(0, 1), n_nodes=8, **{**settings, "lam": 2}))
    assert digest(other) != digest(fresh.model)
