"""Figures of the commands (``--plot PATH``): matplotlib on a file backend, a figure written and closed."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (figures go to files; no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, *, dpi: int = 120) -> None:
    """Lay ``fig`` out, write it to ``path`` and close it; a path that cannot be written is a
    ValueError naming ``--plot`` (the option every command takes the path from)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise ValueError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
