"""The SLA file: schema, YAML positions for errors."""
