"""The arrival screen: a decoded message's feature rows checked once, before they wait for their batch, against
everything in the processor that knows an id (docs/design.md §5). A row refused here never enters A, and the
join buffer takes the rows that passed without looking their ids up again (``JoinBuffer.add_rows``,
``screened``).

Each row is refused by the first of these that knows its id, in this order:

1. the join buffer: the id is pending (waiting for its label), or remembered as labelled, expired unlabelled
   or forgotten on request (``JoinBuffer.refusals``: ``duplicate_id``, ``forgotten_id``);
2. the rows waiting to be predicted, in the micro-batcher or the warm-up hold: ``duplicate_id``;
3. the retention store, when there is one: learned already, past the id memory (``duplicate_id``), or
   forgotten (``forgotten_id``) (``Erasure.refusals``).

The refusals come in that order, each group in row order; each dead letter is the row as a one-row message
(``encoding.row_dead_letters``), all made at the end, or the message's own bytes when it held that row alone.
The ids of one message are unique (the codecs refuse a repeat as ``duplicate_id``), so no repeat is looked for
here. A message none of them knows (the common case) costs two set operations and one look-up of its ids'
fingerprints, and no Python per row.

    >>> import numpy as np
    >>> from iolstream.stream.rows import TargetSpec
    >>> from iolstream.stream.joinbuffer import JoinBuffer
    >>> from iolstream.stream.erasure import Erasure
    >>> join = JoinBuffer(target=TargetSpec.classification((0, 1)), n_features=1, max_pending_rows=10,
    ...                   row_ttl_ms=None, row_ttl_batches=None, early_label_ttl_ms=0, max_early_labels=0,
    ...                   remember_done=10)
    >>> _ = join.add_rows(["a"], np.zeros((1, 1)), batch_seq=1, now_ms=0)
    >>> rows = FeatureRows(["a", "b", "c"], np.ones((3, 1)), np.array([-1, -1, 5]))
    >>> out = screen(rows, join, waiting={"c"}, erasure=Erasure(None, None, None))
    >>> out.rows.ids, out.index, [(bad.reason, letter) for bad, letter in out.refused]
    (['b'], [0, 2], [('duplicate_id', b'{"id":"a","x":[1.0]}'), ('duplicate_id', b'{"id":"c","x":[1.0],"ts":5}')])
"""

from __future__ import annotations

from dataclasses import dataclass

from iolstream.stream.encoding import row_dead_letters
from iolstream.stream.rows import BadInput, FeatureRows


@dataclass(slots=True)
class Screened:
    """What the screen makes of a message's rows.

    rows    : the rows that passed (their order kept), None when none did
    refused : (why, dead letter bytes) of each row refused, in the order of the module docstring
    index   : the refused rows' positions in the rows screened, in the order of ``refused``
    """

    rows: FeatureRows | None
    refused: list[tuple[BadInput, bytes]]
    index: list[int]


def screen(rows: FeatureRows, join, waiting: set[str], erasure, raw: bytes | None = None) -> Screened:
    """``rows`` (unique ids) screened against the join buffer ``join``, the ids ``waiting`` to be predicted and
    the retention store of ``erasure`` (``stream.erasure.Erasure``); ``raw``: the message's bytes when it held
    these rows' one row alone (the dead letter then), else None. Counted in the join buffer's counters."""
    ids = rows.ids
    refused = join.refusals(ids)
    if waiting and not waiting.isdisjoint(ids):
        known = {i for i, _ in refused}
        queued = [i for i, row_id in enumerate(ids) if row_id in waiting and i not in known]
        join.counters["rows_duplicate"] += len(queued)
        refused += [
            (i, BadInput("duplicate_id", f"id {ids[i]!r} is already waiting to be predicted")) for i in queued
        ]
    if erasure.retention is not None and not refused:
        refused = erasure.refusals(ids, join.counters)
    elif erasure.retention is not None:
        known = {i for i, _ in refused}
        rest = [i for i in range(len(ids)) if i not in known]
        refused += [(rest[j], bad) for j, bad in erasure.refusals([ids[i] for i in rest], join.counters)]
    if not refused:
        return Screened(rows, [], [])
    index = [i for i, _ in refused]
    letters = [raw] * len(index) if raw is not None else row_dead_letters(rows, index)
    out = set(index)
    keep = [i for i in range(len(ids)) if i not in out]
    return Screened(
        rows.keep(keep) if keep else None,
        [(bad, letter) for (_, bad), letter in zip(refused, letters)],
        index,
    )
