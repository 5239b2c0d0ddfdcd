"""Exact decode-step coalescing of the reference scheduler (issue 26 item 1).

Most steps of an hour of traffic are *quiet* decode steps: no arrival is due (or requests are
waiting, so an arrival only joins the queue's tail: it is admitted inside the stretch, unless the
pool cannot hold its prompt and it is aborted), no request finishes, no pool runs short enough to evict or retract, no chunked request is pending, and the
prefill admission either is not attempted or refuses the head of the waiting queue for the same
reason as the step before. Such a step changes only counters and the free lists. A *stretch* runs
consecutive quiet steps in one tight loop that does, per step, only what can still change:

- the exact budget check of the refused head (:class:`PrefillBudget` and ``check_prefill``
  themselves, on the live pools and the decayed ``new_token_ratio``): the stretch ends before the
  step whose check would admit, and that step runs the normal path;
- the out-of-window SWA releases due at this step (the model's own ``free_swa_out_of_window``,
  only for the requests whose trigger length is reached: the next trigger of each request is
  known in closed form);
- the page allocations of the requests at a page boundary (``take_free_pages`` of each pool, in batch
  order, as ``alloc_flagged_pages``);
- the token append, length and decode-index updates of every running request, applied together
  when the stretch ends (or before an integrity check inside it);
- the trace rows a step-by-step run writes, in the same order: the clock, the head's ``match``
  row, the release rows and pool rows, the ``step`` row and the ``stats`` rows (these two at the
  step's end clock, as the normal path and the hooks stamp them). A figures-only run with no host
  pool (``detail="figures"``, :mod:`replay.backends.figures`) keeps of these only what its sink
  reads: each step's pool samples (appended to the sink's arrays), the head's ``match`` once (its
  host hit is the same every step) and the release rows; the observer hears of the stretch once
  (``RunObserver.on_decode_steps``). Its *plain* steps (no arrival due, no refresh and no
  budget check of the refused head at them: each of those is known a number of steps ahead) run
  in one tight loop (``_plain_steps``) that does only their out-of-window releases (where the
  countdown says; not under EIC with a refused head), allocations, the ratio's decay, the clock,
  the counters and the samples, the free lists' room kept in local counters
  (``tests/reference/test_plain_steps.py``: the samples are the traced run's ``stats`` rows).

What a normal step would do besides is provably a no-op inside a stretch (no eviction: both pools
keep at least a page per running request on their free lists; no finish: each request's first
finishing decode is found in its token plan; no tree change: ``RadixTree.version`` and the lock
counts stay as they were). The one exception is a stretch's last step: where the first step at
which some request finishes comes before any due arrival, the stretch runs it too, as a quiet step
up to its token appends, then the requests' lengths caught up and its tokens, releases and
completions by the normal path's own ``_process_decode`` (the head's deferred matches applied
first, as the admission attempt precedes them), then its samples; the release's insert may change
the head's match, so the next stretch re-walks it (``_same_head_match``). On ``production_1h``
11,875 finishing steps run so instead of through the normal path. The head's match touches the tree
on every step (recency stamps, SWA LRU order): those effects are applied once when the stretch
ends, with the tree clock advanced by the ticks the skipped matches would have taken, which leaves
every stamp and every LRU order exactly as a step-by-step run leaves them (only stale lazy-heap
entries differ, which no pop sees). The waiting-queue prefix refresh (every 32nd admission) runs
inside the stretch when none of its walks splits a node
(:class:`replay.backends.reference.refresh.RefreshWindow`: the last refresh's walk memos where they
stand, the others walked again as pure reads; no split, so the head's match and lock stand): the
head's matches before it are applied, then its touches, as a step-by-step run orders them. A
stretch stops before a refresh that would split (or that an arrival due at its step would join),
before an integrity check is due, and before any step it cannot prove quiet.

A stretch may start right after a finish: the finished requests leave the running batch first,
as the next step's batch selection drops them, and where the finish's insert changed the tree,
the refused head's walk is run again as a pure read (``RadixTree.peek``); the same hits and
anchor mean the same refusal. It may also start right after a prefill step: that step's requests
join the running batch as the next step's batch selection joins them
(``_merge_last_prefill``), and a head its admission refused after admitting others is the
refusal memo, its match re-walked the same way first.

Exactness is tested row by row against the step-by-step run (``decode_coalescing=off``) on the
differential cases, every bundled workload, a model without SWA and Hypothesis workloads
(``tests/reference/test_fast_paths_exact.py``, which also covers the radix walk memo).

A mixin of :class:`replay.backends.reference.scheduler.ReferenceBackend`.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from replay.backends.base import StepRecord
from replay.backends.reference.budget import CLIP_MAX_NEW_TOKENS, PrefillBudget
from tracer.schema import CacheOp, Mode, Pool, SchedKind

_STEP = int(SchedKind.STEP)
_DECODE = int(Mode.DECODE)
_MATCH = int(CacheOp.MATCH)
_SWA_RELEASE = int(CacheOp.SWA_RELEASE)
_REFRESH_INTERVAL = 32  # admission._WAITING_PREFIX_REFRESH_INTERVAL
_REFRESH_MAX = 128  # admission._WAITING_QUEUE_PREFIX_MATCH_MAX
_NEVER = 1 << 62


def _hits(m) -> tuple:
    """A match's figures and anchors (nodes compare by identity), all a refusal reads of it."""
    return (m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens, m.full_kv_hit_tokens,
            m.swa_branching_tokens, m.last_device_node, m.best_match_node)


class HeadRefusal:
    """What the last admission attempt did when it refused the head of the waiting queue by its
    budget check (and did nothing else): enough to repeat the check and its effects exactly."""

    __slots__ = ("req", "version", "keys", "max_tokens", "match", "extend", "total", "max_new", "swa_host_hit")

    def __init__(self, req, version, keys, max_tokens, match, extend, total, max_new, swa_host_hit) -> None:
        self.req, self.version, self.keys, self.max_tokens, self.match = req, version, keys, max_tokens, match
        self.extend, self.total, self.max_new, self.swa_host_hit = extend, total, max_new, swa_host_hit


class CoalesceMixin:
    """Quiet-stretch runner (see the module docstring)."""

    _head_refusal: HeadRefusal | None = None
    #: waiting-queue prefix refreshes run inside stretches (a diagnostic: the tests see the path run)
    stretch_refreshes: int = 0
    #: budget checks of a refused head a stretch skipped, proven refused (``_refused_for``; a diagnostic)
    stretch_checks_skipped: int = 0
    #: refused heads whose match a stretch found unchanged after the tree changed (``_same_head_match``;
    #: a diagnostic)
    stretch_rematches: int = 0
    #: steps a figures-only stretch ran in its tight loop (``_plain_steps``; a diagnostic)
    plain_steps: int = 0
    #: release steps the plain loop ran (``_plain_steps``' releases; a diagnostic)
    plain_releases: int = 0
    #: finishing steps a stretch ran as its last (``_finish_step``; a diagnostic)
    stretch_finishes: int = 0

    @property
    def _eic(self) -> bool:
        return self.settings.prefix_ownership == "eic_release_protected_prefix"

    # ---------------------------------------------------------------- preconditions
    def _admission_case(self):
        """How the next step's prefill admission would go, without running it: ``"none"`` (not
        attempted, nothing changes), ``"full"`` (no free row: ``batch_is_full`` is set),
        ``"head"`` (the head is refused again, see :class:`HeadRefusal`) or None (unknown: run the
        normal step)."""
        s = self.settings
        batch_is_full = False if (s.has_swa or not self.running) else self.batch_is_full
        if batch_is_full or not self.waiting:
            return "none"
        if self.max_rows - len(self.running) <= 0:
            return "full"
        memo = self._head_refusal
        tree = self.model.tree
        # (a model without SWA keeps ``batch_is_full`` after the refusal: its next attempt is
        # "none", which the normal step reaches first)
        if (memo is None or tree is None or not s.has_swa or self.waiting[0] is not memo.req
                or s.eviction_policy != "lru"):
            return None
        if tree.version != memo.version and not self._same_head_match(memo):
            return None
        if self._eic and self.model.cache.missing_swa_tokens(memo.match) != memo.match.swa_host_hit_tokens:
            return None  # a release freed SWA peers of the head's window since its match (EIC)
        return "head"

    def _same_head_match(self, memo: HeadRefusal) -> bool:
        """Whether the head's match is what it was at its refusal although the tree changed since
        (a finish's insert elsewhere): its walk again as a pure read (``RadixTree.peek``: no split)
        finds the same hits and anchor, so the refusal's figures stand (the memo's match keeps
        them; its version becomes the tree's)."""
        model = self.model
        m = model.peek(memo.keys, max_tokens=memo.max_tokens)
        if m is None or _hits(m) != _hits(memo.match):
            return False
        memo.version = model.tree.version
        self.stretch_rematches += 1
        return True

    def _stretch_limit(self, arrivals_quiet: bool) -> tuple[int, bool]:
        """Most quiet steps from now by arrivals and finishes alone (0: none), and whether the
        step right after them is a finishing step the stretch may run as its last (``finishing``:
        some request finishes at it and no arrival is due before it); with ``arrivals_quiet``
        (requests are waiting: an arrival joins the queue's tail and changes no decision) by
        finishes alone."""
        s = self.settings
        bs = len(self.running)
        step_ns = s.step_fixed_ns + s.step_per_token_ns * bs
        limit = _NEVER
        if not arrivals_quiet and self._next_arrival < len(self._pending):
            gap = self._pending[self._next_arrival].arrival_ns - self.clock_ns
            if gap <= 0:
                return 0, False
            if step_ns > 0:
                limit = -(-gap // step_ns)  # steps whose begin clock is still before the arrival
        finishing = False
        for r in self.running:
            stop = r.finish_index - len(r.output_ids)
            if stop < limit:
                if stop < 0:
                    return 0, False
                limit = stop
                finishing = True  # (the arrival's limit is larger: the finishing step begins before it)
        return limit, finishing

    def _coalesce_ready(self) -> bool:
        s = self.settings
        if self.chunked_req is not None or s.kv_stack == "dsv4":
            return False
        if self.last_mode == "prefill":
            # the prefill's requests join the running batch first, as the next step's batch
            # selection merges them (``_merge_last_prefill``, which that step then finds done)
            self._merge_last_prefill()
        elif self.last_mode != "decode":
            return False
        active = self._active
        for r in self.running:
            if not r.in_model or r.rid not in active:
                # the next step's batch selection first drops the requests that finished (or left
                # the model) since (``_next_batch``): done here as it does it, so that the steps
                # after a finish may run in a stretch
                self.running = [r for r in self.running if r.rid in active and r.in_model]
                self.batch_is_full = False
                break
        if not self.running:
            return False
        tree = self.model.tree
        return not getattr(tree, "_wt_acks", None)

    # ---------------------------------------------------------------- the stretch
    def _run_stretch(self) -> int:
        """Run the quiet steps that follow (possibly none); returns how many ran."""
        if not self._coalesce_ready():
            return 0
        # with requests waiting, the head's fate (or a full batch) decides the admission: an
        # arrival joins the tail and changes nothing but the queue (the refresh, which reads the
        # queue's first 128, ends the stretch), so it is admitted inside the stretch
        arrivals_quiet = bool(self.waiting)
        limit, finishing = self._stretch_limit(arrivals_quiet)
        if limit <= 0 and not finishing:
            return 0
        # with ``finishing``, the step after the ``limit`` quiet ones runs here too, its finishes
        # as the normal path's ``_process_decode`` runs them (``_finish_step``), and ends the stretch
        end = limit + 1 if finishing else limit
        finished = False
        case = self._admission_case()  # (after the limit: it may walk the head's key again)
        if case is None:
            return 0
        pending = self._pending
        n_pending = len(pending)
        s, model = self.settings, self.model
        too_long = self._too_long
        pools = model.pools
        full, swa = pools.full, (pools.swa if pools.has_swa else None)
        batch = self.running
        bs = len(batch)
        ps = s.page_size
        room = bs * ps
        step_ns = s.step_fixed_ns + s.step_per_token_ns * bs
        states = model.requests.reqs
        rows = [states[r.rid] for r in batch]
        obs = self.observer
        begin = getattr(obs, "on_step_begin", None)
        on_step = obs.on_step if obs is not None else None
        # a figures-only run (no host pool) keeps of these steps only the pools' samples, the
        # head's host hit (the same each step) and their CPU: appended and summed here, the
        # observer told once (its sink reads no step row, no device pool row)
        fig = getattr(obs, "figures", None)
        if fig is not None and model.host_full is None and model.host_swa is None:
            fig_full = (full.capacity_tokens, *fig.device_series(POOL_IDS["full"], full.capacity_tokens), ps)
            fig_swa = (swa.capacity_tokens, *fig.device_series(POOL_IDS["swa"], swa.capacity_tokens), ps) \
                if swa is not None else None
            begin = on_step = None
            cpu_ns = 0
        else:
            fig = None
        # releases: each request's trigger length (its ``seq_tokens`` before the step's alloc when
        # ``seq - W >= swa_evicted + interval``); all lengths grow by one per step, so the steps to
        # the next release are a countdown
        release = s.has_swa and s.swa_out_of_window_release != "off"
        trig = [st.swa_evicted_tokens + s.swa_eviction_interval_tokens + s.sliding_window_tokens
                for st in rows] if release else None
        countdown = self._release_countdown(batch, rows, trig) if release else _NEVER
        # allocations: the requests at a page boundary at step j are those with (-seq) % ps == j % ps
        buckets = [[] for _ in range(ps)]
        for i, st in enumerate(rows):
            buckets[-st.seq_tokens % ps].append(i)
        phase = 0
        has_swa = s.has_swa
        head = self._head_refusal if case == "head" else None
        if head is not None:
            tree = model.tree
            lock_full, lock_swa = tree.lock_delta(head.match.last_device_node)
            refresh = self._prefix_refresh_calls
            m = head.match
            hit = (head.req.rid, m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens)
            left = [r.max_new_tokens - len(r.output_ids) for r in batch]  # outputs still to come
            # one budget for the stretch, its reservation set per step (``check_prefill`` changes
            # nothing); a fresh budget's state is ``other`` only when a prefill or chunk limit is
            # not positive, and only then is it built and asked step by step, locks unset, as
            # ``_new_prefill_batch`` asks it
            budget = PrefillBudget.with_offset(model, s, 0.0)
            budget.lock_full, budget.lock_swa = lock_full, lock_swa
            other_possible = budget.rem_input <= 0 or budget.rem_chunk <= 0
            # the most the head's total room (``rem_total``) can grow in one step: the reservation
            # shrinks by at most ``ratio`` per request for the token it decoded and ``decay * CLIP``
            # per request for the ratio's decay; the free list only shrinks inside a stretch
            grow_per_request = self.ratio.current + self.ratio.decay * CLIP_MAX_NEW_TOKENS
        next_check = 0  # the next step whose budget check can admit the head (``_refused_for``)
        eic_head = head is not None and self._eic
        # the requests' lengths, decode indices and output ids lag ``ran - flushed`` steps behind
        # inside the stretch (``_catch_up``); what reads them here adds the lag
        ran = flushed = deferred = 0  # deferred: the head's matches not yet applied
        plain = fig is not None and not self.check_integrity_every  # see ``_plain_steps``
        # the plain loop runs the out-of-window releases of its steps itself (not under EIC with
        # a refused head: a release may change the head's match there, so the stretch stops)
        releases = (batch, rows, trig) if release and not eic_head else None
        while ran < end:
            if plain and ran and ran < limit and (countdown > 0 or releases is not None) and (head is None or (
                    refresh % _REFRESH_INTERVAL and ran < next_check and not other_possible)):
                most = min(limit - ran, self._steps_to_arrival(step_ns))
                if releases is None:
                    most = min(most, countdown)
                if head is not None:
                    most = min(most, _REFRESH_INTERVAL - refresh % _REFRESH_INTERVAL,
                               next_check - ran)
                n, phase, cpu, countdown = self._plain_steps(most, buckets, phase, rows, step_ns, fig_full, fig_swa,
                                                             countdown, releases, ran - flushed)
                if n:
                    self.plain_steps += n
                    cpu_ns += cpu
                    ran += n
                    if head is not None:
                        refresh += n
                        deferred += n
                        self.stretch_checks_skipped += n
                    continue
            # -- preconditions of this step (nothing is changed until they hold)
            if (full.available_tokens() < room or full.free_list_pages() < bs
                    or (swa is not None and (swa.available_tokens() < room or swa.free_list_pages() < bs))):
                break
            if eic_head and countdown <= 0:
                break  # an EIC release may free SWA peers of the head's window: its match changes
            due = self._next_arrival
            while due < n_pending and pending[due].arrival_ns <= self.clock_ns:
                if too_long(pending[due]):
                    break
                due += 1
            if due < n_pending and pending[due].arrival_ns <= self.clock_ns:
                break  # an arrival the pool cannot hold is aborted: the normal path runs it
            touches = None
            if head is not None:
                if refresh % _REFRESH_INTERVAL == 0:
                    # the waiting-queue prefix refresh at this admission: run inside the stretch when
                    # no walk splits (the head's match and lock stand)
                    touches = self._refresh_touches(due)
                    if touches is None:
                        break
                if ran < next_check and not other_possible:
                    self.stretch_checks_skipped += 1
                else:
                    # ``PrefillBudget.__init__``'s reservation, term by term and in batch order, on
                    # the output lengths this step would see (``ran`` tokens appended since ``left``)
                    ratio = self.ratio.current
                    offset = sum([(e if (e := d - ran) < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) * ratio
                                  for d in left])  # min(d - ran, CLIP) * ratio
                    if other_possible and PrefillBudget.with_offset(model, s, offset).state() == "other":
                        break
                    budget.total_offset = offset
                    ok = budget.check_prefill(head.extend, head.total, head.max_new, head.swa_host_hit,
                                              budget.rem_chunk)[0]
                    if ok:
                        break  # admitted at this step: the normal path runs it
                    next_check = ran + self._refused_for(budget, head, bs * grow_per_request,
                                                         countdown if release else _NEVER)
            # -- the step
            t0 = perf_counter_ns()
            clock = self.clock_ns
            if begin is not None:
                begin(clock)
            if due > self._next_arrival:
                self._admit_arrivals()
            if has_swa:
                self.batch_is_full = False  # ``_new_prefill_batch`` resets it for SWA models
            if head is not None:
                if touches is not None:  # the refresh comes between the matches before and this one
                    if deferred:
                        self._apply_head_matches(head, deferred)
                        deferred = 0
                    tree.apply_touches(touches)
                    self.stretch_refreshes += 1
                refresh += 1
                deferred += 1
                if fig is None or not ran:
                    tracer.cache(_MATCH, *hit)
                self.batch_is_full = True  # a ``no_token`` refusal with requests running
            elif case == "full":
                self.batch_is_full = True
            self._last_retracted = 0
            self.ratio.decay_step()
            if countdown <= 0:
                countdown = self._stretch_releases(batch, rows, trig, ran - flushed)
            need = buckets[phase]
            if need:
                got = full.take_free_pages(len(need))
                if swa is not None:
                    mapping = pools.mapping
                    for f, p in zip(got, swa.take_free_pages(len(need))):
                        mapping[f] = p
                for i, page in zip(need, got):
                    rows[i].pages.append(page)
            phase = phase + 1 if phase + 1 < ps else 0
            countdown -= 1
            self.clock_ns = clock + step_ns
            res = self.result
            res.num_decode_steps += 1
            res.decode_tokens += bs
            res.num_steps += 1
            res.clock_ns = self.clock_ns
            self._idle_streak = 0
            self._sampled_idle = False
            self.trace_ct += 1
            if ran == limit:  # the finishing step: its finishes before its samples, as the normal path
                if deferred:  # the head's matches (this step's too) come before the finishes
                    self._apply_head_matches(head, deferred)
                    deferred = 0
                self._finish_step(batch, rows, ran - flushed)
                flushed = ran + 1
                finished = True
                self.stretch_finishes += 1
            if fig is not None:  # the step's samples, at its end clock (as its ``stats`` rows)
                _sample(fig_full, self.clock_ns, full.available_pages())
                if fig_swa is not None:
                    _sample(fig_swa, self.clock_ns, swa.available_pages())
                cpu_ns += perf_counter_ns() - t0
            else:
                fct = self.trace_ct
                tracer.set_clock(self.clock_ns)  # the step and stats rows at the step's end (``step``)
                tracer.sched(_STEP, fct, _DECODE, bs, bs, 0)
                stats = tracer.stats
                for name, capacity, available, evictable, protected, held in model.occupancy_rows():
                    stats(fct, POOL_IDS[name], capacity, available, evictable, protected, held)
            record = StepRecord(self.forward_ct, "decode", bs, bs, step_ns, self.clock_ns, 0,
                                perf_counter_ns() - t0) if on_step is not None else None
            self.forward_ct += 1
            ran += 1
            if on_step is not None:
                on_step(record, self)
            if self.check_integrity_every and self.forward_ct % self.check_integrity_every == 0:
                _catch_up(batch, rows, ran - flushed)
                flushed = ran
                self.check_integrity()
        _catch_up(batch, rows, ran - flushed)
        if ran and fig is not None:
            tracer.set_clock(self.clock_ns)  # where the last step left the sink's clock
            obs.on_decode_steps(ran, cpu_ns, self.clock_ns)
        if ran:
            self.last_batch, self.last_mode = list(batch), "decode"  # (a stretch may follow a prefill step)
            if head is not None:
                self._prefix_refresh_calls = refresh
                if deferred:
                    self._apply_head_matches(head, deferred)
                if not finished:  # (a finish's insert may change the head's match: the next stretch peeks)
                    head.version = model.tree.version
        return ran

    def _finish_step(self, batch, rows, lag: int) -> None:
        """The end of a stretch's finishing step (its allocations, clock and counters done): the
        ``lag`` steps before it applied (``_catch_up``: none of them finishes), this step's
        lengths and decode indices as ``_prepare_decode`` advances them, then its tokens, releases
        and completions by the normal path's own ``_process_decode``, in batch order."""
        _catch_up(batch, rows, lag)
        for r, st in zip(batch, rows):
            st.seq_tokens += 1
            r.decode_batch_idx += 1
        self._process_decode(batch)

    def _steps_to_arrival(self, step_ns: int) -> int:
        """Steps from now that begin before the next pending arrival (none may be due inside a
        run of plain steps)."""
        if self._next_arrival >= len(self._pending):
            return _NEVER
        gap = self._pending[self._next_arrival].arrival_ns - self.clock_ns
        if gap <= 0:
            return 0
        return (gap - 1) // step_ns + 1 if step_ns > 0 else _NEVER

    def _plain_steps(self, most: int, buckets: list, phase: int, rows: list, step_ns: int, fig_full: tuple,
                     fig_swa: tuple | None, countdown: int, releases: tuple | None,
                     lag: int) -> tuple[int, int, int, int]:
        """At most ``most`` steps of a figures-only stretch that do nothing but decode (no arrival
        due, no refresh and no budget check of the refused head at them): each step's
        precondition (both free lists hold a page per running request), its out-of-window
        releases where ``countdown`` says one is due (``releases``: the stretch's batch, rows and
        trigger lengths, the requests' lengths ``lag`` steps behind at the first step; None: no
        release may be due, ``most`` stops before it), its page allocations, the ratio's decay,
        the clock and counters, its pool samples, all in one tight loop, exactly as the
        stretch's own step. Returns (steps run, the next phase, their CPU ns, the steps to the
        next release)."""
        t0 = perf_counter_ns()
        model = self.model
        pools = model.pools
        full, swa = pools.full, (pools.swa if pools.has_swa else None)
        bs = len(rows)
        ps = len(buckets)
        free_full = full.free_list_pages()
        avail_full = full.available_pages()
        free_swa = swa.free_list_pages() if swa is not None else _NEVER
        avail_swa = swa.available_pages() if swa is not None else _NEVER
        mapping = pools.mapping if swa is not None else None
        ratio = self.ratio
        cur, decay, low = ratio.current, ratio.decay, ratio.min
        clock = self.clock_ns
        # the samples (``_sample``) appended here: (capacity in tokens, clocks, used, page size)
        cap_full, ts_full, used_full, ps_full = fig_full
        if fig_swa is not None:
            cap_swa, ts_swa, used_swa, ps_swa = fig_swa
        n = 0
        while n < most and free_full >= bs and avail_full >= bs and free_swa >= bs and avail_swa >= bs:
            if countdown <= 0:  # this step's releases, before its allocations (``_prepare_decode``)
                countdown = self._stretch_releases(*releases, lag + n)
                self.plain_releases += 1
                free_swa = swa.free_list_pages()
                avail_swa = swa.available_pages()
            countdown -= 1
            need = buckets[phase]
            if need:
                k = len(need)
                got = full.take_free_pages(k)
                free_full -= k
                avail_full -= k
                if mapping is not None:
                    for f, p in zip(got, swa.take_free_pages(k)):
                        mapping[f] = p
                    free_swa -= k
                    avail_swa -= k
                for i, page in zip(need, got):
                    rows[i].pages.append(page)
            phase = phase + 1 if phase + 1 < ps else 0
            cur -= decay  # max(cur - decay, low)
            if cur < low:
                cur = low
            clock += step_ns
            ts_full.append(clock)
            used_full.append(cap_full - avail_full * ps_full)
            if fig_swa is not None:
                ts_swa.append(clock)
                used_swa.append(cap_swa - avail_swa * ps_swa)
            n += 1
        if n:
            ratio.current = cur
            self.clock_ns = clock
            res = self.result
            res.num_decode_steps += n
            res.decode_tokens += bs * n
            res.num_steps += n
            res.clock_ns = clock
            self.trace_ct += n
            self.forward_ct += n
            self._idle_streak = 0
            self._sampled_idle = False
            self._last_retracted = 0  # (``batch_is_full`` stays as the stretch's last step set it)
        return n, phase, perf_counter_ns() - t0, countdown

    def _refused_for(self, budget: PrefillBudget, head: HeadRefusal, grow: float, countdown: int) -> int:
        """Checks of the head, this step's included, that are refused as this one was, proven
        without running them (1: only this one). The check admits only when the head's total fits
        (``head.total < rem_total``) and its SWA need does (or a shrink cap is positive). Inside a
        stretch ``rem_total`` grows by at most ``grow`` a step (the free list only shrinks), and
        the SWA room grows only at a release step (``countdown`` steps from now, 0: this step's,
        which comes after its check): whichever part failed fails as long as that bound says."""
        total_room = budget.rem_total
        short = head.total - total_room  # >= 0: the total does not fit now
        steps = 1
        if short >= 0 and grow > 0:
            # a margin far above the float sum's rounding (<< 1 token)
            steps = max(steps, int((short - 2.0 - 1e-9 * abs(total_room)) / grow) + 1)
        if short < 0 or steps == 1:  # the total fits (or may soon): is the SWA part what failed?
            ok_swa = budget.check_prefill(head.extend, head.total, head.max_new, head.swa_host_hit,
                                          budget.rem_chunk, total_fits=True)[0]
            if not ok_swa:
                steps = max(steps, max(countdown, 0) + 1)
        return steps

    def _refresh_touches(self, due: int) -> list | None:
        """The waiting-queue prefix refresh of this step (``_touch_waiting_prefixes``) as touches
        to apply inside the stretch, or None when it cannot run there: an arrival due now would
        join the first ``_WAITING_QUEUE_PREFIX_MATCH_MAX`` it walks, or a walk would split a node
        (which changes the head's match)."""
        if due > self._next_arrival and len(self.waiting) < _REFRESH_MAX:
            return None
        return self._window_bests(self.waiting[:_REFRESH_MAX])

    def _apply_head_matches(self, head: HeadRefusal, n: int) -> None:
        """The effects of the head's ``n`` (> 0) matches a stretch deferred: the last one run, the
        tree clock advanced by the ticks of the others."""
        self.model.tree.clock += n - 1
        self.model.touch(head.keys, max_tokens=head.max_tokens)  # (``match``'s effects, no result)

    def _stretch_releases(self, batch, rows, trig, lag: int) -> int:
        """The out-of-window releases due at this step, in batch order (the normal path's test per
        request; lengths ``lag`` steps behind); returns the steps to the next one."""
        model, s = self.model, self.settings
        interval = s.swa_eviction_interval_tokens
        for i, st in enumerate(rows):
            r = batch[i]
            seq = st.seq_tokens + lag
            if seq < trig[i] or r.decode_batch_idx + lag < 1:
                continue
            freed = model.free_swa_out_of_window(r.rid, seq, interval)
            if freed:
                tracer.cache(_SWA_RELEASE, r.rid, 0, 0, 0, 0, freed)
            trig[i] = st.swa_evicted_tokens + interval + s.sliding_window_tokens
        return self._release_countdown(batch, rows, trig, lag)

    @staticmethod
    def _release_countdown(batch, rows, trig, lag: int = 0) -> int:
        """Steps from now to the first step at which some request's release test passes (0: this
        step); a request before its first decode is not tested at this step."""
        best = _NEVER
        for i, st in enumerate(rows):
            d = trig[i] - st.seq_tokens - lag
            if d <= 0 and batch[i].decode_batch_idx + lag < 1:
                d = 1
            if d < best:
                best = d
        return max(best, 0)


def _sample(series: tuple, clock_ns: int, available_pages: int) -> None:
    """One ``stats`` sample of a pool into a figures-only sink's arrays: ``series`` is (capacity
    in tokens, clock samples, used samples, page size)."""
    capacity, ts, used, ps = series
    ts.append(clock_ns)
    used.append(capacity - available_pages * ps)


def _catch_up(batch, rows, k: int) -> None:
    """Apply ``k`` decode steps to the requests' lengths, decode indices and output ids (the
    tokens of their plans: no request finishes inside a stretch)."""
    if k <= 0:
        return
    for r, st in zip(batch, rows):
        st.seq_tokens += k
        r.decode_batch_idx += k
        out = r.output_ids
        n = len(out)
        out.extend(r.plan[n:n + k])


POOL_IDS = {"full": int(Pool.FULL), "swa": int(Pool.SWA), "host_full": int(Pool.HOST_FULL),
            "host_swa": int(Pool.HOST_SWA)}

__all__ = ["POOL_IDS", "CoalesceMixin", "HeadRefusal"]
