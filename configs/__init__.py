"""Shipped YAML configurations."""

__all__: list[str] = []
