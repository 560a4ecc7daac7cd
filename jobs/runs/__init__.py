"""A run of a job: :class:`~jobs.runs.batch.Batch` and the TOML runner, the job's run (opened,
recovered, recorded), its session, lock and fence, its lifecycle and observers (report,
lineage, metrics), the audit of staged data and the preflight checks."""
