"""Trainers: the built-in GRPO trainer (``trainers.grpo``) and the OpenRLHF plugin (``trainers.openrlhf``)."""

__all__: list[str] = []
