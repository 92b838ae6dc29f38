"""Campaign orchestration: scheduler, Ray actors, tracking, Parquet store and CLI."""
