"""Environments, protocols, retrieval and reward schemes."""
