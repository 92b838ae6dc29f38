"""Observers of a run's transitions: summary.json, MLflow, Parquet, metrics, the live view, the bug store."""
