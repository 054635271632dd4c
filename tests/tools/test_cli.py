"""Tests for the ``iolstream`` command line (cli.py, and the evaluate/simulate commands)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from iolstream.tools.cli import COMMANDS, main

FAST = ["--nodes", "16", "--layers", "2"]


@pytest.fixture
def csv_file(tmp_path):
    """A small, learnable 3-class CSV with string labels."""

    def write(rows=None, name="data.csv"):
        if rows is None:
            rng = np.random.default_rng(0)
            x = rng.standard_normal((120, 3))
            labels = np.array(["a", "b", "c"])[np.argmax(x @ rng.standard_normal((3, 3)), axis=1)]
            rows = [f"{u:.4f},{v:.4f},{w:.4f},{lab}" for (u, v, w), lab in zip(x, labels)]
        path = tmp_path / name
        path.write_text("f1,f2,f3,label\n" + "\n".join(rows) + "\n")
        return str(path)

    return write


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(rc, err, *needles):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith("iolstream evaluate: error: ") or lines[0].startswith(
        "iolstream simulate: error: "
    )
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# --------------------------------------------------------------------------- bad input


def test_unknown_column(capsys, csv_file):
    rc, _, err = run(capsys, "evaluate", "--csv", csv_file(), "--target", "nosuch", *FAST)
    assert_usage_error(rc, err, "'nosuch'", "f1, f2, f3, label")


def test_text_and_gaps_make_named_fields_with_an_inferred_schema(capsys, csv_file):
    """Text or a gap (blank, nan, NA) in a feature column: the rows are named fields, read by the schema
    inferred from the file, and evaluate says so (docs/design.md §11)."""
    path = csv_file(["1,2,3,a", "4,five,6,b", "7,,9,a", "1,nan,2,b"] * 5)
    rc, out, _ = run(capsys, "evaluate", "--csv", path, "--target", "label", "--quiet", *FAST)
    assert rc == 0
    assert "schema: inferred from data.csv (2 numbers, 1 categories, 0 booleans, 1 with gaps" in out


def test_a_value_the_given_schema_refuses(capsys, csv_file, tmp_path):
    schema = tmp_path / "schema.yaml"
    schema.write_text(
        "model:\n  classes: [a, b]\n  features:\n"
        + "".join(f"    - {{name: f{i}, type: number}}\n" for i in (1, 2, 3))
    )
    path = csv_file(["1,2,3,a", "4,five,6,b", "7,8,9,a"] * 5)
    rc, _, err = run(capsys, "evaluate", "--csv", path, "--target", "label", "--schema", str(schema), *FAST)
    assert_usage_error(rc, err, "row 2: bad_field: field 'f2' is a string, not a number")


def test_unknown_class(capsys, csv_file):
    rc, _, err = run(capsys, "evaluate", "--csv", csv_file(), "--target", "label", "--classes", "a,b", *FAST)
    assert_usage_error(rc, err, "unknown class 'c'", "declared classes: ['a', 'b']")


def test_unknown_class_for_integer_labels(capsys):
    rc, _, err = run(capsys, "evaluate", "--dataset", "iris", "--classes", "0,1", *FAST)
    assert_usage_error(rc, err, "unknown class 2")


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--dataset", "iris", "--mode", "sideways"], ["--mode", "invalid choice", "'sideways'"]),
        (["--dataset", "nosuch"], ["unknown data set 'nosuch'", "segment"]),
        (["--csv", "x.csv"], ["--csv needs --target"]),
        (["--dataset", "iris", "--target", "y"], ["--target applies only to --csv"]),
        (["--dataset", "iris", "--label-delay", "0"], ["--label-delay: must be an integer ≥ 1"]),
        (["--dataset", "iris", "--batch", "-3"], ["--batch", "'-3'"]),
        (["--dataset", "iris", "--batch", "2.5"], ["--batch", "2.5"]),
        (["--dataset", "iris", "--test-fraction", "1.5"], ["--test-fraction: must be in (0, 1)"]),
        (["--dataset", "iris", "--lam", "0"], ["--lam", "positive"]),
        (["--dataset", "iris", "--lam", "1", "--log2-inv-lam", "2"], ["not allowed with"]),
        (["--dataset", "iris", "--baseline", "svm"], ["--baseline", "invalid choice"]),
        (["--dataset", "iris", "--plot", "curve.pdf"], ["--plot", ".png"]),
        (["--csv", "/nonexistent/file.csv", "--target", "y"], ["/nonexistent/file.csv", "cannot read"]),
        (["--dataset", "iris", "--rows", "2"], ["need at least"]),
        ([], ["one of the arguments --dataset --csv is required"]),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, needles):
    rc, _, err = run(capsys, "evaluate", *argv)
    assert_usage_error(rc, err, *needles)


def test_numerical_failure_is_one_line_with_a_hint(capsys):
    # N(0, 1) weights under 8 ReLU layers: features ~10⁸, far too large for λ = 1e-9.
    rc, _, err = run(
        capsys,
        "evaluate",
        "--dataset",
        "wine",
        "--nodes",
        "64",
        "--layers",
        "8",
        "--init",
        "normal",
        "--lam",
        "1e-9",
        "--quiet",
    )
    assert_usage_error(rc, err, "not positive definite", "try a larger --lam")


def test_plot_to_unwritable_place(capsys, tmp_path):
    rc, _, err = run(
        capsys, "evaluate", "--dataset", "iris", "--quiet", *FAST, "--plot", str(tmp_path / "no" / "dir.png")
    )
    assert_usage_error(rc, err, "cannot write")


# --------------------------------------------------------------------------- evaluate


def test_table_while_running(capsys, csv_file):
    rc, out, err = run(capsys, "evaluate", "--csv", csv_file(), "--target", "label", *FAST)
    assert rc == 0 and err == ""
    assert "test acc" in out and "preq acc" in out
    assert out.count("edRVFL-F") >= 3 and out.count("edRVFL-R") >= 3  # curve rows and the summary
    assert "96 training rows in 32 batches of 3" in out


def test_json_objects(capsys, csv_file):
    rc, out, err = run(
        capsys,
        "evaluate",
        "--csv",
        csv_file(),
        "--target",
        "label",
        *FAST,
        "--json",
        "--seed",
        "3",
        "--baseline",
        "os-elm",
        "--log2-inv-lam",
        "2",
    )
    assert rc == 0
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["name"] for o in objs] == ["edRVFL-F", "edRVFL-R", "os-elm"]
    for o in objs:
        for key in (
            "metric",
            "test_metric",
            "prequential_metric",
            "cumulative_regret",
            "regret_bound",
            "rows_per_second",
            "seconds",
            "curve",
        ):
            assert key in o
        assert o["metric"] == "accuracy" and o["seed"] == 3
        assert all(len(p) == 2 for p in o["curve"])
    assert objs[0]["config"]["lam"] == 0.25 and objs[0]["config"]["n_nodes"] == 16
    assert objs[0]["test_metric"] == pytest.approx(objs[1]["test_metric"])
    assert "edRVFL-F" in err  # the table went to stderr
    for o in objs:  # the metrics teams watch, beside prequential_metric (stream.prequential)
        assert 0 < o["log_loss"] < 5 and 0 <= o["brier"] <= 2 and 0 <= o["balanced_accuracy"] <= 1, o
        assert o["mae"] is None and o["roc_auc"] is None  # three classes: no AUC
        assert set(o["per_class"]) == {"a", "b", "c"}
        assert all(set(v) == {"precision", "recall"} for v in o["per_class"].values())
    assert "log loss" in err and "bal. acc" in err


def test_json_regression_reports_mae(capsys):
    rc, out, _ = run(capsys, "evaluate", "--dataset", "diabetes", *FAST, "--json", "--mode", "ridge")
    assert rc == 0
    (o,) = [json.loads(line) for line in out.splitlines()]
    assert o["mae"] > 0 and o["log_loss"] is None and o["per_class"] == {}


def test_quiet_prints_only_the_summary(capsys):
    rc, out, err = run(capsys, "evaluate", "--dataset", "iris", *FAST, "--quiet")
    assert rc == 0 and err == ""
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["model", "test", "accuracy"]  # the summary's header, no curve table
    assert [line.split()[0] for line in lines[1:3]] == ["edRVFL-F", "edRVFL-R"]
    assert "kernels compiled or loaded before timing" in out


def test_stream_order_prints_no_test_columns_and_no_nan(capsys):
    rc, out, _ = run(
        capsys,
        "evaluate",
        "--dataset",
        "sea",
        "--rows",
        "1500",
        "--order",
        "stream",
        *FAST,
        "--mode",
        "forward",
    )
    assert rc == 0 and "nan" not in out.lower()
    assert "no test split" in out and "test acc" not in out
    header = next(line for line in out.splitlines() if line.startswith("model"))
    assert header.split() == [
        "model",
        "preq",
        "accuracy",
        "first",
        "20%",
        "last",
        "20%",
        "log",  # the prequential metrics beside it (two classes: ROC AUC too)
        "loss",
        "Brier",
        "ROC",
        "AUC",
        "bal.",
        "acc",
        "cum.",
        "regret",
    ] + [
        "bound",
        "rows/s",
        "seconds",
    ]
    rows = [line for line in out.splitlines() if line.startswith("edRVFL-F ")]
    assert len(rows) == 1  # the summary row: no header without rows before it


def test_regression_reports_the_warmup_rows_left_out(capsys):
    rc, out, _ = run(
        capsys, "evaluate", "--dataset", "friedman", "--rows", "1000", *FAST, "--mode", "forward", "--quiet"
    )
    assert rc == 0 and "nan" not in out.lower()
    assert "edRVFL-F: preq leaves out the first" in out and "target scaling was known" in out
    assert "every row" not in out
    rc, out, _ = run(
        capsys, "evaluate", "--dataset", "friedman", "--rows", "300", *FAST, "--mode", "ridge", "--quiet"
    )
    assert rc == 0 and "every row, the stream is shorter than the warm-up's 256 labels (--warmup-rows" in out
    args = [
        "--dataset",
        "friedman",
        "--rows",
        "1200",
        *FAST,
        "--mode",
        "ridge",
        "--baseline",
        "river-softmax",
    ]
    rc, out, _ = run(capsys, "evaluate", *args, "--json", "--quiet")
    ridge, river = (json.loads(line) for line in out.splitlines())
    assert rc == 0 and ridge["warmup_rows_excluded"] == river["warmup_rows_excluded"] > 0  # the same rows


def test_defaults_come_from_model_config(capsys):
    from iolstream.core.model import ModelConfig

    rc, out, _ = run(capsys, "evaluate", "--dataset", "iris", "--json", "--quiet", "--mode", "forward")
    (obj,) = [json.loads(line) for line in out.splitlines()]
    default = ModelConfig(n_inputs=4, classes=(0, 1, 2))
    for key in ("n_nodes", "n_layers", "lam", "activation", "init", "scaler", "warmup_rows"):
        assert obj["config"][key] == getattr(default, key), key


def test_no_regret(capsys):
    rc, out, _ = run(capsys, "evaluate", "--dataset", "iris", *FAST, "--no-regret", "--json", "--quiet")
    forward, ridge = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and forward["cumulative_regret"] is None and forward["regret_bound"] is None
    assert ridge["cumulative_regret"] is not None  # -R's A_r is its A: the regret costs nothing extra
    assert forward["test_metric"] == ridge["test_metric"]


def test_regression_dataset(capsys):
    rc, out, _ = run(capsys, "evaluate", "--dataset", "friedman", "--rows", "600", *FAST, "--json", "--quiet")
    objs = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [o["metric"] for o in objs] == ["rmse", "rmse"] and objs[0]["rows"] == 480


def test_plot_writes_a_png(capsys, tmp_path):
    path = tmp_path / "curves.png"
    rc, out, _ = run(capsys, "evaluate", "--dataset", "iris", *FAST, "--plot", str(path))
    assert rc == 0 and f"plot written to {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- simulate


def test_simulate_prints_the_table(capsys, tmp_path):
    path = tmp_path / "sim.png"
    rc, out, err = run(capsys, "simulate", "-T", "40", "-n", "2", "--lam", "0.01", "1/T", "--plot", str(path))
    assert rc == 0, err
    assert "single stream" in out and "batch stream" in out
    assert out.count("  -R  ") == 4 and out.count("  -F  ") == 4  # 2 streams × 2 λ
    assert "CR_T" in out and "‖β−β°‖²" in out
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_simulate_json(capsys):
    rc, out, _ = run(
        capsys, "simulate", "-T", "30", "-n", "2", "--lam", "0.01", "--streams", "batch", "--json", "--quiet"
    )
    objs = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [(o["stream"], o["mode"]) for o in objs] == [
        ("batch", "ridge"),
        ("batch", "forward"),
        ("batch", "auto"),
    ]
    assert {"cumulative_regret", "beta_error", "immediate_regret"} <= set(objs[0])


def test_simulate_bad_lambda(capsys):
    rc, _, err = run(capsys, "simulate", "--lam", "0")
    assert_usage_error(rc, err, "--lam")


# --------------------------------------------------------------------------- registry


def test_top_level_help_imports_no_command():
    code = (
        "import sys; from iolstream.tools.cli import main; rc = main(['--help']);"
        "heavy = [m for m in ('numba', 'iolstream.core.model', 'iolstream.tools.evaluate', 'matplotlib') if m in sys.modules];"
        "print('RESULT', rc, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "RESULT 0 []" in out
    for name in COMMANDS:
        assert name in out


def test_unknown_command(capsys):
    rc, _, err = run(capsys, "nosuch")
    assert rc == 2 and err.strip().startswith("iolstream: error: argument COMMAND: invalid choice")
