"""The step tuner: how a step uses the cores, chosen by timing the real steps.

The cores are used either by the step kernels' own parallel loops (single-threaded
BLAS in each thread) or, for large matrices, by OpenBLAS's threads; a ``StepTuner``
attached to the model picks, by timing the real steps, whichever is faster lately —
or one core when another process holds the other. ``configure_for_model`` sets the BLAS pools for a model
(``blas_pools``) and attaches its tuner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numba
from threadpoolctl import threadpool_limits

from iolstream.core.blas_pools import blas_threads_for, configure_blas, is_numpy_blas


@dataclass(frozen=True)
class StepSetting:
    """How a step runs: SciPy's BLAS threads, and whether the fused kernels split the work
    over Numba's threads (then BLAS runs single-threaded in each of them)."""

    blas_threads: int
    parallel: bool


def step_settings(n_columns: int, cores: int | None = None) -> list[StepSetting]:
    """The settings worth timing for a model with ``n_columns`` on ``cores`` cores."""
    cores = cores or os.cpu_count() or 1
    if cores == 1:
        return [StepSetting(1, False)]
    settings = [StepSetting(1, False), StepSetting(1, True)]
    if blas_threads_for(n_columns) is None:  # large matrices: OpenBLAS's own threads may win instead
        settings.append(StepSetting(cores, False))
    return settings


def configure_for_model(model) -> None:
    """Process-wide BLAS policy for ``model`` (an EdRVFL): NumPy's pool to 1 thread; SciPy's to
    1 thread for small models; and a StepTuner attached to the model that picks, by timing the
    real steps, among parallel fused kernels and (large models only) OpenBLAS's own threads."""
    configure_blas()
    threads = blas_threads_for(model.network.n_columns)
    if threads is not None:
        threadpool_limits(limits=threads, user_api="blas")
    settings = step_settings(model.network.n_columns, min(os.cpu_count() or 1, numba.get_num_threads()))
    model.learner.parallel = False
    model.thread_tuner = StepTuner(settings) if len(settings) > 1 else None


TRIAL_STEPS = 3  # timed steps of a retry (after its untimed first), judged by their median


class StepTuner:
    """Chooses a StepSetting per step by timing the real steps.

    Parallel work is ~1.7× faster on an idle 2-core machine, but up to 10× slower when
    another process holds a core (a parallel region waits for a thread the scheduler has
    parked). So each step runs with the setting that has been fastest lately, and now and then
    a few steps retry another one: after ``period`` steps, then — each time it loses again —
    after twice as many, up to ``max_period`` (retries of a 10× slower setting then cost ~4 %).
    The first step after a switch is not timed (waking or parking threads, a kernel's JIT); a
    retry is judged by the median of its next TRIAL_STEPS steps, so that one step stalled by
    another process does not decide it. Judged by the mean of two, the parallel kernels lost a
    retry to such a stall now and then, and a worker behind its input ran serially for the next
    128–256 steps: 2–38 % of a 120k-row catch-up serial where 2 % was its due (4 runs).

    ``explore`` False is for a worker keeping up with a live stream, where latency matters and
    throughput does not: no retries (a retry of a setting that lost by 10× stalls the stream for
    its four steps, ~130 ms on the small config), and a step that takes less than
    ``live_serial_seconds`` serially runs serially (the first setting): both cores would save it
    a millisecond or two, but a parallel region waits 10–20 ms for its thread whenever another
    process (the broker, a producer, the client's threads) takes the other core. Together these
    were most of the p99 latency at half load.
    """

    live_serial_seconds = 0.01

    def __init__(self, settings: list[StepSetting], period: int = 32, max_period: int = 1024):
        self.settings = list(settings)
        self.period, self.max_period = period, max_period
        self.cost = {s: None for s in self.settings}  # seconds per row: the best's a running average
        self.steps = 0
        self._interval = {s: period for s in self.settings}  # steps between retries of a loser
        self._due = {s: period for s in self.settings}  # step of its next retry
        self._trial = None  # the setting being retried
        self._samples: list[float] = []
        self._lib = None
        self._last = None
        self._switched = False
        self._rows = 0  # of the last step
        self.explore = True

    def _controller(self):
        if self._lib is None:
            from threadpoolctl import ThreadpoolController

            libs = [
                c
                for c in ThreadpoolController().lib_controllers
                if c.user_api == "blas" and not is_numpy_blas(c.info())
            ]
            self._lib = libs[0] if libs else False
        return self._lib

    def choose(self) -> StepSetting:
        """The setting for the next step (BLAS threads applied here; the caller applies ``parallel``)."""
        untried = [s for s in self.settings if self.cost[s] is None]
        if untried:
            setting = untried[0]
        elif self._trial is not None:
            setting = self._trial
        elif not self.explore and self.cost[self.settings[0]] * self._rows < self.live_serial_seconds:
            setting = self.settings[0]
        else:
            best = min(self.cost, key=self.cost.get)
            due = (
                [s for s in self.settings if s != best and self._due[s] <= self.steps] if self.explore else []
            )
            setting = best
            if due:
                setting = self._trial = due[0]
                self._samples = []
        if self._last is None or setting.blas_threads != self._last.blas_threads:
            lib = self._controller()
            if lib:
                lib.set_num_threads(setting.blas_threads)
        self._switched = setting != self._last
        self._last = setting
        return setting

    def record(self, setting: StepSetting, seconds: float, rows: int) -> None:
        self.steps += 1
        self._rows = rows
        if self._switched:
            return
        per_row = seconds / max(rows, 1)
        if setting != self._trial:
            old = self.cost[setting]
            # a running average whose samples count at most 1.25× it: one stalled step (another
            # process took the core for a few ms) moves it by ≤ 12.5 %; a lasting slowdown, 3 steps
            # of it, flips the choice
            self.cost[setting] = per_row if old is None else 0.5 * old + 0.5 * min(per_row, 1.25 * old)
            return
        self._samples.append(per_row)
        if len(self._samples) < TRIAL_STEPS:
            return
        incumbent = min(c for s, c in self.cost.items() if s != setting)
        self.cost[setting] = sorted(self._samples)[len(self._samples) // 2]
        self._trial = None
        if self.cost[setting] < incumbent:  # it won: the others are retried soon
            for s in self.settings:
                self._interval[s] = self.period
                self._due[s] = self.steps + self.period
        else:
            self._interval[setting] = min(2 * self._interval[setting], self.max_period)
            self._due[setting] = self.steps + self._interval[setting]
