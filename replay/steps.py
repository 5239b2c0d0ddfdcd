"""Which step a trace row belongs to: steps are told apart by their place in the trace.

A step is its ``sched`` step row's position among the step rows in ``seq`` order, never its
``forward_ct``: sglang's own ``Scheduler`` counts batches run, so an idle step's row repeats the
``forward_ct`` of the batch step before it (on live servers, on the real-Scheduler backend and on
the reference backend alike). Rows written during a step (admissions, pool ops) come before its
step row; ``stats`` samples come after it.
"""

from __future__ import annotations


def number_steps(step_rows, name: str = "step", offset: int = 0):
    """The step rows (a Polars frame of ``sched`` rows of kind ``step``) sorted by ``seq`` with
    column ``name``: their position, starting at ``offset``."""
    import polars as pl

    return step_rows.sort("seq").with_row_index(name, offset=offset).with_columns(pl.col(name).cast(pl.Int64))


def step_of_rows(rows, numbered, name: str = "step", *, before: bool = True):
    """``rows`` (a Polars frame with ``seq``) with column ``name`` from ``numbered``
    (:func:`number_steps`): the first step row after each row (``before=True``: rows written
    during their step), else the last one before it (samples taken after their step). Null when
    there is none."""
    return rows.sort("seq").join_asof(numbered.select("seq", name), on="seq",
                                      strategy="forward" if before else "backward")
