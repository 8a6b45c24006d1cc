"""Offline model directories (generated shapes and tiny models)."""
