"""SGLang's KV rule (``kv_rule: estimated``): admission on an estimated output, retraction when a
decode step runs out of KV.

A request holds the KV of the tokens it has computed. A waiting request joins a prefill step
while its prompt plus its output (clipped at 4096) stays under the free KV less, per decoding
request, its clipped remaining output times ``new_token_ratio``, less, per request of this step,
its chunk and (when the chunk ends its prompt) its clipped output. A refusal, or ``max_seqs``,
stops admission until the running batch shrinks (SGLang's ``batch_is_full``). The ratio starts
at 0.7, falls by (0.7 - 0.098) / 600 each decode step down to 0.098, and returns to 0.7 when the
engine idles. A decode step without KV for one token per running request retracts requests
(most outputs kept: fewest outputs, then longest prompt, then latest admitted go first) until
20 tokens per remaining request are free; they go to the back of the queue and are recomputed
from scratch (counted in ``preemptions``), and the ratio becomes (outputs so far + 20 per
request) / outputs, at most 1, over the requests left. KV is counted in tokens; the radix
cache's reuse of a retracted prompt is not modelled. The constants and their sources:
``conf/serving/schedulers.yaml``, backend ``sglang``.
"""

from __future__ import annotations

import numpy as np

from leaderboard.serving.scheduler import Engine, Policy, StepLog

# Defaults of SGLang 0.5.x with schedule_conservativeness 1.0 (sources in the yaml).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096


# mem_fraction_static when the launch leaves it unset, by GPU memory (MiB): before the general
# heuristics, a reserve of (base + per GPU x TP x PP) GiB per bucket of memory below each bound;
# with them, a reserve derived from the chunked-prefill size and the CUDA-graph batch ceiling
# each bucket sets (sources in the yaml, backend ``sglang``, ``memory_rule``).
BUCKETED_RESERVE_GIB = ((35, 2.8, 0.1), (90, 9.5, 0.5), (160, 12.0, 0.5), (float("inf"), 32.0, 0.0))
# (below GiB, chunked_prefill_size, cuda_graph_max_bs at TP < 4, at TP >= 4)
GENERAL_BUCKETS = ((60, 4096, 32, 160), (90, 8192, 256, 512), (160, 8192, 256, 512),
                   (float("inf"), 16384, 512, 512))


def static_memory_fraction(gpu_gib: float, tp: int, general: bool) -> float:
    """SGLang's default ``mem_fraction_static`` on a GPU of ``gpu_gib`` at ``tp`` (no pipeline
    or DP attention, no speculative decoding, the default CUDA-graph sizes): bucketed reserves,
    or with ``general`` the reserve from the chunked-prefill size and CUDA-graph ceiling. SGLang
    reads the memory nvidia-smi reports (81,559 MiB on an H100 80GB); the replay, the
    datasheet's GiB, which puts an H100's fraction 0.001 higher."""
    gpu_mib = gpu_gib * 1024
    if not general:
        base, per_gpu = next((b, g) for bound, b, g in BUCKETED_RESERVE_GIB if gpu_gib < bound)
        reserved = (base + per_gpu * tp) * 1024
    else:
        if gpu_gib < 35:
            raise ValueError(f"SGLang's general memory rule for a {gpu_gib} GiB GPU is not in "
                             "leaderboard/serving/sglang_kv.py (buckets from 35 GiB up); add its "
                             "bucket from sglang server_args.py")
        chunk, small_tp, large_tp = next(b[1:] for b in GENERAL_BUCKETS if gpu_gib < b[0])
        graphs = small_tp if tp < 4 else large_tp
        # SGLang takes max(chunk, 2048) and floors the reserve at 10 GiB above 60 GB: neither
        # binds for these buckets (chunks from 4096, reserves from 13 GiB above 60 GB)
        reserved = 512 + chunk * 1.5 + graphs * 2 + tp / 8 * 1024
    return round((gpu_mib - reserved) / gpu_mib, 3)


class EstimatedEngine(Engine):
    """The scheduler state of an SGLang engine: ``Engine`` plus the output-ratio estimate."""

    def __init__(self, policy: Policy, prompt: np.ndarray, output: np.ndarray):
        super().__init__(policy, prompt, output)
        self.init_ratio = INIT_NEW_TOKEN_RATIO
        self.min_ratio = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = self.init_ratio
        self.full = False  # batch_is_full: no prefill is tried until the running batch shrinks
        self.shrunk = False  # a request finished since the last decode step
        self.emitted = np.zeros(len(prompt), np.int64)  # outputs made before a retraction

    def _outputs(self, r: int) -> int:
        """Output tokens request ``r`` has produced (kept through a retraction)."""
        return max(int(self.emitted[r]), int(self.done[r] - self.prompt[r] + 1), 0)

    def _est_output(self, r: int) -> int:
        return min(int(self.output[r]), CLIP_MAX_NEW_TOKENS_ESTIMATION)

    def _plan(self) -> list[tuple[int, int]]:
        """A prefill step (the unfinished prompt first, then waiting requests in order while the
        estimate holds them), else a decode step of every running request."""
        if not self.running and (self.full or not self.waiting):  # an idle iteration
            self.full, self.ratio = False, self.init_ratio
        prefilling = [r for r in self.running if self.done[r] < self.prefill[r]]
        if prefilling or (self.waiting and not self.full):
            plan = self._prefill(prefilling)
            if plan:
                return plan
        return self._decode()

    def _prefill(self, prefilling: list[int]) -> list[tuple[int, int]]:
        """SGLang's PrefillAdder: a new request's prompt plus clipped output must stay under the
        free KV less the running requests' estimated outputs and this step's takes."""
        p, budget, plan = self.policy, self.policy.token_budget, []
        used = int(self.done[self.running].sum()) if self.running else 0
        offset = sum(min(int(self.output[r]) - self._outputs(r), CLIP_MAX_NEW_TOKENS_ESTIMATION)
                     * self.ratio for r in self.running if self.done[r] >= self.prefill[r])

        def take(r: int) -> None:
            nonlocal budget, offset
            t = min(self._need(r), budget)
            plan.append((r, t))
            budget -= t
            offset += t + (self._est_output(r) if t == self._need(r) else 0)

        for r in prefilling:  # SGLang's chunked request: no KV check
            if budget > 0:
                take(r)
        while self.waiting and budget > 0:
            if len(self.running) >= p.max_seqs:
                self.full = True
                break
            r = self.waiting[0]
            total = int(self.prefill[r] - self.done[r]) + self._est_output(r)
            if total >= p.kv_tokens - used - offset and self.running:  # an empty engine takes any
                self.full = True
                break
            take(self._admit())
            if p.kv_tokens - used - offset <= 0:
                self.full = True
                break
        return plan

    def _decode(self) -> list[tuple[int, int]]:
        """update_running_batch: without KV for one token per request, retract until 20 tokens
        per remaining request are free and re-estimate the ratio; else decay it."""
        if self.shrunk:
            self.full, self.shrunk = False, False
        run = self.running
        free = self.policy.kv_tokens - (int(self.done[run].sum()) if run else 0)
        if run and free < len(run):
            order = sorted(run, key=lambda r: (self._outputs(r), -int(self.prompt[r])),
                           reverse=True)
            first = True
            while (first or free < RETRACT_DECODE_STEPS * len(order)) and len(order) > 1:
                first = False
                r = order.pop()
                free += int(self.done[r])
                self._retract(r)
            self.ratio = min(1.0, (sum(self._outputs(r) for r in run)
                                   + RETRACT_DECODE_STEPS * len(run))
                             / int(self.output[run].sum()))
            self.full = False
        elif run:
            self._decay(1)
        return [(r, 1) for r in self.running]

    def _decay(self, steps: int) -> None:
        """The ratio after ``steps`` decode steps, one decay each, never under the floor."""
        for _ in range(steps):
            self.ratio = max(self.ratio - self.ratio_decay, self.min_ratio)

    def _retract(self, r: int) -> None:
        """Free ``r``'s KV and queue it last (SGLang extends the waiting queue) to recompute
        its prompt and outputs."""
        self.emitted[r] = self._outputs(r)
        self.running.remove(r)
        self.reserved -= int(self.prompt[r] + self.output[r])
        self.prefill[r] = self.done[r]
        self.done[r] = 0
        self.waiting.append(r)
        self.preemptions += 1

    def _decode_run(self) -> int:
        """Identical decode steps ahead: none tries a prefill (nothing waits, or admission stopped
        and no request has finished since), none lacks KV, none ends a request."""
        run = np.asarray(self.running)
        if not len(run) or len(run) > self.policy.token_budget:
            return 0
        if (self.done[run] < self.prefill[run]).any():
            return 0
        if self.waiting and (not self.full or self.shrunk):
            return 0
        left = int((self.prompt[run] + self.output[run] - 1 - self.done[run]).min())
        return min(left, (self.policy.kv_tokens - int(self.done[run].sum())) // len(run))

    def step(self, log: StepLog, max_steps: int) -> int:
        finished, shrunk = len(self.finished), self.shrunk
        k = super().step(log, max_steps)
        if k > 1:  # a run of decode steps (a single one is ``_decode``'s): each decays the ratio
            self.full, self.shrunk = self.full and not shrunk, False
            self._decay(k)
        if len(self.finished) > finished:
            self.shrunk = True
        if not self.busy:  # SGLang resets the estimate when idle
            self.ratio, self.full = self.init_ratio, False
        return k
