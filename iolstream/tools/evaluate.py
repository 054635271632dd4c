"""``iolstream evaluate``: the command line over the evaluation protocol (``tools.protocol``): data set,
model and protocol options, baselines, JSON; the summary table and the plots are ``tools.report``'s.
"""

from __future__ import annotations

import numpy as np

from iolstream.core.activation_kernels import ACTIVATIONS
from iolstream.core.candidates import SCORE_ALL_ROWS
from iolstream.core.model import HALF_LIFE_CANDIDATES, LAM_CANDIDATES
from iolstream.core.network import INITS
from iolstream.tools.baselines import BASELINES, make_baseline
from iolstream.tools.dataset import DataError, Dataset
from iolstream.tools.protocol import (
    DEFAULT_BATCH,
    ORDERS,
    EdRVFLLearner,
    Protocol,
    baselines_scored_from,
    make_split,
    model_config,
    plain_label,
    run_protocol,
)
from iolstream.tools.report import plot_curves, plot_windows, summary


def add_parser(subparsers):
    """``iolstream evaluate``: the protocol above, as a command."""
    from iolstream.tools.arguments import add_data_source, model_defaults, positive_float, positive_int

    defaults = model_defaults()
    p = subparsers.add_parser(
        "evaluate",
        help="run the IOL process over a data set and report it as the paper does",
        description=(
            "Shuffle with the seed, hold out a test set, stream the rest in batches: predict each batch "
            "(the prequential metric), learn its labels label-delay batches later, and measure the test "
            "metric at logarithmically spaced time points. Model defaults come from ModelConfig."
        ),
    )
    src = add_data_source(p)
    src.add_argument(
        "--task",
        choices=("auto", "classification", "regression"),
        default="auto",
        help="--csv only: classification or regression (default: auto)",
    )
    src.add_argument(
        "--schema",
        metavar="YAML",
        help="--csv only: encode the rows by the model.features of this worker config (default: a CSV with "
        "text or blank cells gets a schema inferred from it, as `iolstream schema infer` prints it)",
    )
    src.add_argument(
        "--classes",
        metavar="A,B,...",
        help="declare the class list (comma-separated); a label outside it is an error",
    )
    src.add_argument(
        "--rows",
        type=positive_int,
        metavar="N",
        help="use at most N rows (after shuffling; poker: generate N)",
    )
    src.add_argument(
        "--no-sort-cards",
        dest="sort_cards",
        action="store_false",
        help="poker: keep the cards in draw order (default: sorted, as the paper did)",
    )

    mdl = p.add_argument_group("model (defaults: ModelConfig)")
    mdl.add_argument(
        "--mode",
        choices=("forward", "ridge", "both", "auto"),
        default="both",
        help="-F, -R, both, or auto: -F and -R chosen online, each candidate's own prequential metric and regret "
        "reported beside the model's, from the same run (default: both)",
    )
    mdl.add_argument(
        "--layers",
        type=positive_int,
        default=defaults["n_layers"],
        metavar="L",
        help="hidden layers L (default: %(default)s)",
    )
    mdl.add_argument(
        "--nodes",
        type=positive_int,
        default=defaults["n_nodes"],
        metavar="N",
        help="nodes per layer N (default: %(default)s)",
    )
    lam = mdl.add_mutually_exclusive_group()
    lam.add_argument(
        "--lam",
        type=_auto_or(positive_float),
        metavar="λ",
        help=f"ridge prior λ, or auto (chosen online among {', '.join(map(str, LAM_CANDIDATES))}) "
        f"(default: {defaults['lam']})",
    )
    lam.add_argument("--log2-inv-lam", type=float, metavar="V", help="λ = 2^-V, as in the paper's tables")
    mdl.add_argument(
        "--forgetting",
        type=_auto_or(positive_float),
        metavar="H",
        help="half-life in rows: a row seen H rows ago weighs 1/2; auto: chosen online among "
        f"{', '.join(map(str, HALF_LIFE_CANDIDATES))} (default: none, never forget)",
    )
    mdl.add_argument(
        "--scoring-share",
        type=_all_or(positive_float),
        metavar="S",
        help=f"auto: after the first {SCORE_ALL_ROWS:,} rows (all scored), the candidates not in force are scored "
        "on the batches S × the step's work pays for; "
        f"all: every batch (default: {defaults['scoring_share']})",
    )
    mdl.add_argument(
        "--activation", choices=ACTIVATIONS, default=defaults["activation"], help="(default: %(default)s)"
    )
    mdl.add_argument(
        "--init",
        choices=INITS,
        default=defaults["init"],
        help="random weights (default: %(default)s, the activation's own: xavier for relu, spread for sigmoid)",
    )
    mdl.add_argument(
        "--scaler",
        choices=("warmup", "fixed", "none"),
        default=defaults["scaler"],
        help="z-score from the first --warmup-rows training rows, from the whole training part "
        "(fixed), or none (default: %(default)s)",
    )
    mdl.add_argument(
        "--warmup-rows",
        type=positive_int,
        default=defaults["warmup_rows"],
        metavar="W",
        help="(default: %(default)s)",
    )
    mdl.add_argument(
        "--dtype", choices=("float64", "float32"), default=defaults["dtype"], help="(default: %(default)s)"
    )
    mdl.add_argument(
        "--no-regret",
        dest="track_regret",
        action="store_false",
        help="do not track the regret (-F then skips one Gram update per labelled batch: faster; "
        "its cumulative regret and both bounds are reported as null)",
    )

    prot = p.add_argument_group("protocol")
    prot.add_argument(
        "--batch",
        type=_batch,
        default=DEFAULT_BATCH,
        metavar="B",
        help="rows per batch, or a fraction of the training set if < 1, e.g. 0.0027 (default: %(default)s)",
    )
    prot.add_argument(
        "--label-delay",
        type=int,
        default=1,
        metavar="D",
        help="labels of batch t arrive before batch t+D is predicted; 1 is the paper's (default: 1)",
    )
    prot.add_argument(
        "--order",
        choices=ORDERS,
        default="shuffle",
        help="shuffle (test set held out, the paper's protocol) or stream: the rows in their own order, "
        "test-then-train, no test set; reports the prequential metric overall, over the first 20 %% "
        "after the warm-up, over the last 20 %%, and a windowed curve (default: %(default)s)",
    )
    prot.add_argument("--test-fraction", type=float, default=0.2, metavar="F", help="(default: %(default)s)")
    prot.add_argument(
        "--seed",
        type=int,
        default=defaults["seed"],
        help="shuffle, random weights and generated data (default: %(default)s)",
    )
    prot.add_argument(
        "--curve-points",
        type=positive_int,
        default=20,
        metavar="P",
        help="about P log-spaced test points (default: %(default)s)",
    )
    prot.add_argument(
        "--curve-test-rows",
        type=int,
        default=20_000,
        metavar="R",
        help="test rows used for the curve, 0 = all; the final metric uses all (default: %(default)s)",
    )
    prot.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME",
        choices=BASELINES,
        help="also run a comparison learner on the same stream (repeatable): " + ", ".join(BASELINES),
    )

    out = p.add_argument_group("output")
    out.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per mode/baseline on stdout (the table goes to stderr)",
    )
    out.add_argument(
        "--per-batch", action="store_true", help="with --json: add the per-batch prequential metric and loss"
    )
    out.add_argument("--plot", metavar="FILE.png", help="draw the test-metric curves over rows seen")
    out.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar and no curve table: only the summary (nothing but the JSON with --json)",
    )
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    """The ``evaluate`` command: validate everything, then run and report."""
    import json
    import sys

    from iolstream.tools import builtin_datasets, drift
    from iolstream.tools.arguments import model_defaults
    from iolstream.tools.progress import ProgressBar, Table

    defaults = model_defaults()
    if args.csv is not None and not args.target:
        raise ValueError("--csv needs --target COLUMN")
    if args.csv is None and args.target:
        raise ValueError("--target applies only to --csv")
    if args.csv is None and args.task != "auto":
        raise ValueError("--task applies only to --csv")
    if args.csv is None and args.schema is not None:
        raise ValueError("--schema applies only to --csv")
    if args.csv is None and args.dataset not in builtin_datasets.DATASETS:
        raise DataError(
            f"unknown data set {args.dataset!r}; valid names: {', '.join(builtin_datasets.DATASETS)}"
        )
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        raise ValueError(f"--plot: expected a .png file name, got {args.plot!r}")
    try:
        protocol = Protocol(
            batch=args.batch,
            label_delay=args.label_delay,
            test_fraction=args.test_fraction,
            seed=args.seed,
            rows=args.rows,
            curve_points=args.curve_points,
            curve_test_rows=args.curve_test_rows or None,
            order=args.order,
        )
    except ValueError as exc:  # "label_delay: ..." -> "--label-delay: ..."
        key, _, rest = str(exc).partition(":")
        raise ValueError(f"--{key.replace('_', '-')}:{rest}") from None
    model = dict(
        n_nodes=args.nodes,
        n_layers=args.layers,
        activation=args.activation,
        init=args.init,
        seed=args.seed,
        scaler=args.scaler,
        warmup_rows=args.warmup_rows,
        dtype=args.dtype,
        track_regret=args.track_regret,
    )
    if args.forgetting is not None:
        model["forgetting"] = args.forgetting
    if args.scoring_share is not None:
        model["scoring_share"] = args.scoring_share
    if args.lam is not None:
        model["lam"] = args.lam
    elif args.log2_inv_lam is not None:
        model["lam"] = 2.0 ** (-args.log2_inv_lam)
    modes = ("forward", "ridge") if args.mode == "both" else (args.mode,)
    classes = _parse_classes(args.classes) if args.classes else None

    if args.csv is not None:
        dataset = _csv_dataset(
            args, say=lambda line: print(line, file=sys.stderr if args.json else sys.stdout)
        )
    elif args.dataset == "poker":
        dataset = builtin_datasets.load("poker", rows=args.rows, seed=args.seed, sort_cards=args.sort_cards)
    elif args.dataset in ("friedman", *drift.STREAMS) and args.rows is not None:
        dataset = builtin_datasets.load(args.dataset, n_rows=args.rows, seed=args.seed)
    else:
        dataset = builtin_datasets.load(args.dataset, seed=args.seed)
    if classes is not None and dataset.task == "classification":
        classes = _match_classes(classes, dataset)

    # Validate every learner before the first batch runs (a bad value fails here, not mid-run).
    split = make_split(dataset, protocol, classes=classes)
    learners = [EdRVFLLearner(model_config(split, mode, model)) for mode in modes]
    held = 0  # a baseline beside a regression model: scored on the model's rows (``baselines_scored_from``)
    if args.baseline:
        config = model_config(split, "ridge", model)
        learners += [make_baseline(name, split, config) for name in args.baseline]
        held = baselines_scored_from(config, modes)

    table_stream = sys.stderr if args.json else sys.stdout
    verbose = not args.quiet  # --quiet: no progress, no curve table; the summary still (unless --json)
    stream_order = protocol.order == "stream"
    b = protocol.batch_rows(len(split.x_train))
    n_batches = -(-len(split.x_train) // b)
    if verbose:
        held_out = (
            "stream order: test-then-train over the rows as they come, no test split"
            if stream_order
            else f"{len(split.x_test)} test rows"
        )
        print(
            f"{dataset.description}\n{len(split.x_train)} training rows in {n_batches} batches of {b}, "
            f"{held_out}, label delay {protocol.label_delay}, seed {protocol.seed}",
            file=table_stream,
        )
    results, warned = [], False
    metric = split.metric
    for learner in learners:
        bar = ProgressBar(n_batches, learner.name, enabled=None if verbose else False)
        # the curve table: test points exist only with a test split (shuffle order)
        table = None
        if verbose and not stream_order:
            table = Table(
                [
                    ("model", 9),
                    ("batch", 11),
                    ("rows", 9),
                    (f"test {metric[:3]}", 8, ".4f"),
                    (f"preq {metric[:3]}", 8, ".4f"),
                    ("rows/s", 9, ",.0f"),
                ],
                stream=table_stream,
                bar=bar,
            )
            print(file=table_stream)
            table.header()

        def on_point(pt, table=table):
            if table is not None:
                table.row(
                    pt.name,
                    f"{pt.t}/{pt.n_batches}",
                    pt.rows_seen,
                    pt.test_metric,
                    pt.prequential_metric,
                    pt.rows_per_second,
                )

        def on_batch(t, total, bar=bar):
            bar.update(t, f"batch {t}/{total}")

        try:
            result = run_protocol(
                learner, split, protocol, on_point=on_point, on_batch=on_batch, scored_from_label=held
            )
        except np.linalg.LinAlgError as exc:  # the Gram lost positive definiteness: features ≫ λ
            raise ValueError(
                f"{learner.name}: {exc} (the hidden features are too large for λ = {model.get('lam', defaults['lam'])}: "
                "try a larger --lam, or --init xavier/kaiming)"
            ) from None
        finally:
            bar.close()
        results.append(result)
        units = getattr(learner, "units", None)
        if units is not None and units.mostly_linear and not warned:  # once: -F and -R draw the same units
            print(f"warning: {units.describe()}; try {units.remedy('--{} {}')}", file=sys.stderr)
            warned = True
        if args.json:
            print(json.dumps(result.to_json(per_batch=args.per_batch), allow_nan=False), flush=True)

    if verbose or not args.json:
        summary(results, table_stream)
    if args.plot and stream_order:
        drifts = drift.drift_points(dataset.name, len(split.x_train)) if dataset.name in drift.STREAMS else []
        plot_windows(
            results, args.plot, drifts, title=f"{dataset.name}: prequential {metric} per window, stream order"
        )
    elif args.plot:
        plot_curves(results, args.plot, title=f"{dataset.name}: test {metric} over the stream")
    if args.plot and verbose:
        print(f"plot written to {args.plot}", file=table_stream)
    return 0


def _csv_dataset(args, say) -> Dataset:
    """The --csv data: numbers as they are; with --schema, when a cell is text or blank, or when a column only
    counts the rows (``schema_infer.counts_rows``: left out, as ``schema infer`` leaves it out of a worker's
    config), the rows as named fields encoded by the config's schema or the one inferred from the file (``say``
    is told which)."""
    from iolstream.core.schema_infer import infer_schema
    from iolstream.tools.csv_file import load_csv, load_table
    from iolstream.tools.records import choose_schema, schema_dataset

    if args.schema is None:
        table = load_table(args.csv, args.target, task=args.task)
        if not table.needs_schema() and len(infer_schema(table.columns)[0].fields) == len(table.columns):
            return load_csv(args.csv, args.target, task=args.task)
        return schema_dataset(table, choose_schema(table, None, source=args.csv, say=say))
    from iolstream.kafka.config import load_config

    schema = load_config(args.schema).model.schema
    if schema is None:
        raise ValueError(f"--schema: {args.schema} has no model.features")
    table = load_table(args.csv, args.target, task=args.task)
    return schema_dataset(table, choose_schema(table, schema, source=args.schema, say=say))


# ------------------------------------------------------------------------ arg helpers


def _auto_or(kind):
    """An argparse type: the word ``auto``, or a value of ``kind``."""

    def parse(text: str):
        return "auto" if text.strip().lower() == "auto" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _all_or(kind):
    """An argparse type: the word ``all``, or a value of ``kind``."""

    def parse(text: str):
        return "all" if text.strip().lower() == "all" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _batch(text: str) -> float:
    import argparse

    from iolstream.tools.arguments import positive_float

    value = positive_float(text)
    if value >= 1:
        if value != int(value):
            raise argparse.ArgumentTypeError(f"expected whole rows (≥ 1) or a fraction (< 1), got {text!r}")
        return int(value)
    return value


def _parse_classes(text: str) -> list[str]:
    classes = [c.strip() for c in text.split(",") if c.strip()]
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ValueError(f"--classes: need at least 2 distinct comma-separated classes, got {text!r}")
    return classes


def _match_classes(classes: list[str], dataset: Dataset) -> list:
    """Declared classes as given on the command line, typed like the data set's labels."""
    if all(isinstance(plain_label(c), (int, np.integer)) for c in dataset.classes):
        try:
            return [int(c) for c in classes]
        except ValueError:
            raise DataError(
                f"--classes: the labels of {dataset.name} are integers, got {','.join(classes)!r}"
            ) from None
    return classes
