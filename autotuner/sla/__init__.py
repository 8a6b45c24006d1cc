"""The SLA file: schema and validation, the SLA's own load, the quality limits."""
