"""What a verify batch of k+1 positions costs against one step, on this machine (and the
draft model's step): measured once per model, machine and settings, and kept in a cache
file as the next run's prior. A restarted worker reads them there rather than measuring
again (the draft step alone costs two prompt reads), and so does the draft model's
vocabulary check."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from fimls.drafting import monotone
from fimls.engine.llama import LlamaModel
from fimls.engine.parts import EngineParts

log = logging.getLogger(__name__)


def _file_key(path: Path) -> str:
    """A file as a cache key: a changed file is another one."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


class CostCalibration(EngineParts):
    """Verify-cost calibration (a part of :class:`fimls.engine.core.Engine`)."""

    def _probe_tokens(self) -> list[int]:
        text = "def probe(values):\n    total = 0\n    for v in values:\n        total += v\n"
        head = [self.vocab.bos] if self.vocab.bos >= 0 else []
        return (head + self.vocab.tokenize(text * 4))[:64]

    def _cost_key(self) -> str:
        return (f"{_file_key(self.cfg.model_path)}|"
                f"{self.cfg.threads}|{self.placement.gpu_layers}|{self.cfg.n_batch}|"
                f"{self.policy.max_draft}")

    def _draft_key(self, what: str) -> str:
        assert self.cfg.draft_model is not None
        return f"{what}|{self._cost_key()}|{_file_key(self.cfg.draft_model)}"

    def _cached_figure(self, key: str) -> dict[str, float] | None:
        """A figure an earlier start cached under ``key``."""
        entry = self._read_cost_cache().get(key)
        if not isinstance(entry, dict):
            return None
        try:
            return {str(k): float(v) for k, v in entry.items()}
        except (TypeError, ValueError):
            return None

    def _cache_figure(self, key: str, entry: dict[str, float]) -> None:
        path = self.cfg.cost_cache
        if path is None:
            return
        table = self._read_cost_cache()
        table[key] = {k: round(v, 4) for k, v in entry.items()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(table))
        except OSError:
            log.debug("cannot cache %s at %s", key.split("|", 1)[0], path)

    def _vocab_checked(self) -> bool:
        """Whether an earlier start found the draft model's vocabulary the main model's."""
        return self._cached_figure(self._draft_key("vocab")) is not None

    def _vocab_passed(self) -> None:
        self._cache_figure(self._draft_key("vocab"), {"same": 1.0})

    def _draft_step_prior(self) -> float:
        """The draft model's step against the main model's: cached, else measured now."""
        entry = self._cached_figure(self._draft_key("draft_step"))
        if entry is not None and entry.get("ratio", 0.0) > 0.0:
            return entry["ratio"]
        ratio = self._measure_draft_step()
        self._cache_figure(self._draft_key("draft_step"), {"ratio": ratio})
        return ratio

    def _read_cost_cache(self) -> dict[str, Any]:
        path = self.cfg.cost_cache
        if path is None:
            return {}
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return table if isinstance(table, dict) else {}

    def _prior_costs(self) -> dict[int, float]:
        """The starting cost table: cached from an earlier run (measured at its start, or
        learned during it), else measured now. Real timings then refine it."""
        entry = self._cached_figure(self._cost_key())
        if entry is not None:
            try:
                return {int(k): v for k, v in entry.items()}
            except ValueError:
                pass
        costs = self.measure_batch_costs()
        self._write_cost_cache(costs)
        return costs

    def _write_cost_cache(self, costs: dict[int, float]) -> None:
        self._cache_figure(self._cost_key(), {str(k): v for k, v in sorted(costs.items())})

    def measure_batch_costs(self) -> dict[int, float]:
        """Time verify batches of k+1 positions against one step, on this machine.

        Matrix kernels change with the batch size (on a CPU, 5 positions can cost less
        than 3), so every draft length up to the maximum is timed, in interleaved rounds
        (the median of three), so a burst of load hits every length alike.
        """
        base = self._probe_tokens()
        n = len(base)
        self.model.kv_truncate(0)
        self.model.prefill(base, 0)
        extra = (base[1:] * 2)[:self.policy.max_draft + 1]
        lengths = [k for k in range(self.policy.max_draft + 1) if k + 1 <= self.model.n_batch // 2]
        samples: dict[int, list[float]] = {k: [] for k in lengths}
        for _ in range(3):
            for k in lengths:
                self.model.kv_truncate(n)
                t0 = time.perf_counter()
                self.model.decode(extra[:k + 1], n, list(range(k + 1)))
                for i in range(k + 1):
                    int(np.argmax(self.model.logits(i)))
                samples[k].append(time.perf_counter() - t0)
        self.model.kv_truncate(0)
        self.cache.forget()
        times = {k: sorted(v)[1] for k, v in samples.items()}
        costs = monotone({k: t / times[0] for k, t in times.items()})
        log.info("verify cost (x one step) by draft length: %s",
                 ", ".join(f"{k}:{c:.2f}" for k, c in sorted(costs.items())))
        return costs

    def _measure_draft_step(self) -> float:
        """The draft model's single step, relative to the main model's (a prior: real
        proposals refine it)."""
        dm = self.draft_model
        base = self._probe_tokens()

        def step(model: LlamaModel) -> float:
            model.kv_truncate(0)
            model.prefill(base, 0)
            best = float("inf")
            for _ in range(3):
                model.kv_truncate(len(base))
                t0 = time.perf_counter()
                model.decode(base[1:2], len(base), [0])
                int(np.argmax(model.logits(0)))
                best = min(best, time.perf_counter() - t0)
            model.kv_truncate(0)
            return best

        ratio = step(dm.model) / step(self.model)
        dm.kv = []
        self.cache.forget()
        log.info("draft model step costs %.2f main steps", ratio)
        return ratio
