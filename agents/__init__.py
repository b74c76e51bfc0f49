"""Bundled agents and model backends."""
