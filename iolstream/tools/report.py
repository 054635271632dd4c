"""What ``iolstream evaluate`` shows a person: the summary table (with ``mode: auto``, its -F and -R
candidates measured in the same run) and the learning-curve plots."""

from __future__ import annotations

from iolstream.tools.figures import pyplot, save_figure
from iolstream.tools.learners import MODE_SHORT


def summary(results, stream) -> None:
    from iolstream.tools.progress import Table

    metric = results[0].metric
    stream_order = results[0].order == "stream"
    columns = [("model", 14)]
    if not stream_order:
        columns.append((f"test {metric}", 13, ".4f"))
    columns.append((f"preq {metric}", 13, ".4f"))
    if stream_order:
        columns += [("first 20%", 10, ".4f"), ("last 20%", 10, ".4f")]
    # the prequential metrics beside it (stream.prequential): AUC with two classes only
    extras = ["mae"] if metric == "rmse" else ["log_loss", "brier", "balanced_accuracy"]
    if any(r.roc_auc is not None and r.roc_auc == r.roc_auc for r in results):
        extras.insert(2, "roc_auc")
    heads = {
        "mae": "MAE",
        "log_loss": "log loss",
        "brier": "Brier",
        "roc_auc": "ROC AUC",
        "balanced_accuracy": "bal. acc",
    }
    columns += [(heads[key], 9, ".4f") for key in extras]
    columns += [
        ("cum. regret", 12, ".4g"),
        ("bound", 10, ".4g"),
        ("rows/s", 9, ",.0f"),
        ("seconds", 8, ".2f"),
    ]
    print(file=stream)
    table = Table(columns, stream=stream)
    table.header()

    def row(name, test, preq, first20, last20, more, regret, bound, rate, seconds):
        middle = [preq, first20, last20] if stream_order else [test, preq]
        table.row(name, *middle, *more, regret, bound, rate, seconds)

    for r in results:
        row(
            r.name,
            r.test_metric,
            r.prequential_metric,
            r.prequential_first20,
            r.prequential_last20,
            [getattr(r, key) for key in extras],
            r.cumulative_regret,
            r.regret_bound,
            r.rows_per_second,
            r.seconds,
        )
        if r.config.get("mode") == "auto":  # its candidates, side by side, measured in the same run
            for c in r.config["candidate_results"]:
                lam = "" if c["lam"] == r.config.get("lam") else f" λ={c['lam']:g}"
                name = f"  {MODE_SHORT[c['mode']]}{lam}"
                row(
                    name,
                    None,
                    c["prequential_metric"],
                    None,
                    None,
                    [None] * len(extras),
                    c["cumulative_regret"],
                    None,
                    None,
                    None,
                )
    notes = []
    if stream_order:
        notes.append(
            "stream order: no test split; preq is test-then-train over every row, first 20% starts after "
            "the warm-up rows"
        )
    for r in results:
        eff = r.config.get("effective") or {}
        if eff and (stream_order or r.config.get("mode") == "auto"):
            force = f"lam={eff.get('lam')} h={eff.get('forgetting')}"
            if r.config.get("mode") == "auto":
                force += f" mode={MODE_SHORT[eff['mode']]}"
            notes.append(f"in force at the end, {r.name}: {force}")
    for r in results:
        if r.warmup_rows_excluded:
            every = (
                f": every row, the stream is shorter than the warm-up's {r.config.get('warmup_rows')} labels "
                "(--warmup-rows sets them)"
                if r.warmup_rows_excluded >= r.rows and r.config.get("warmup_rows")
                else ""
            )
            notes.append(
                f"{r.name}: preq leaves out the first {r.warmup_rows_excluded:,} rows, predicted before the "
                f"target scaling was known (the regression warm-up; a baseline beside it, the same rows){every}"
            )
    compile_seconds = sum(r.compile_seconds for r in results)
    if compile_seconds:
        notes.append(f"kernels compiled or loaded before timing: {compile_seconds:.2f} s (not in rows/s)")
    for note in notes:
        print(note, file=stream)


def plot_curves(results, path: str, *, title: str = "") -> None:
    """Test metric over rows seen (log x), one line per mode/baseline (the paper's Figs. 4, 6, 9)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ax.plot(r.curve_rows, [v for _, v in r.curve], marker="o", markersize=3, label=r.name)
    ax.set_xscale("log")
    ax.set_xlabel("training rows seen")
    ax.set_ylabel(f"test {results[0].metric}")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def plot_windows(results, path: str, drift_rows: list[int], *, title: str = "") -> None:
    """The windowed prequential metric over rows (linear x), one line per learner, drift points as dashed lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        eff = r.config.get("effective")
        label = r.name + (f" (λ {r.config.get('lam')}, h {r.config.get('forgetting')})" if eff else "")
        ax.plot([x for x, _ in r.window_curve], [v for _, v in r.window_curve], label=label)
    for row in drift_rows:
        ax.axvline(row, color="k", linestyle="--", alpha=0.5)
    ax.set_xlabel("rows")
    ax.set_ylabel(f"prequential {results[0].metric} per window")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
