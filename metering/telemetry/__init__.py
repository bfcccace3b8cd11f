"""What observes the rest: Prometheus metrics, logs, tracing, and the lag gauges read from
the database (`lag`)."""
