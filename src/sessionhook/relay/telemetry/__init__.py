"""Logs and metrics: what every other layer of the relay reports through."""
