"""The run: controller, executors and actors, the run-state store."""
