"""Built-in scenario files (YAML data): concrete batches replayed through the backends."""
