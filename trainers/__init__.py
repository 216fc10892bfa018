"""Trainers (OpenRLHF plugin, built-in GRPO): see the trainers issue."""

__all__: list[str] = []
