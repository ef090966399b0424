"""Prometheus metrics of the ledger (a registry per app; labels bounded by dataset only)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LedgerMetrics:
    """Admission and lease counters, and per-dataset budget gauges (filter figures)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter("dpsynth_ledger_admissions_total",
                                  "Admissions through the RDP filter", ["decision"],
                                  registry=self.registry)
        self.leases = Counter("dpsynth_ledger_leases_granted_total", "Step leases granted",
                              registry=self.registry)
        self.spent = Gauge("dpsynth_ledger_dataset_epsilon_spent",
                           "Filter epsilon spent (committed)", ["dataset_id"],
                           registry=self.registry)
        self.remaining = Gauge("dpsynth_ledger_dataset_epsilon_remaining",
                               "Epsilon limit minus the filter figure of committed + reserved",
                               ["dataset_id"], registry=self.registry)

    def budget(self, dataset_id: str, figures: dict[str, float]) -> None:
        """Record a dataset's figures after a write."""
        self.spent.labels(dataset_id=dataset_id).set(figures["dataset_epsilon_spent"])
        self.remaining.labels(dataset_id=dataset_id).set(figures["dataset_epsilon_remaining"])
