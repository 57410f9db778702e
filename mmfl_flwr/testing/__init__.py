"""Helpers for testing MMFL apps: hostile clients (:mod:`.hostile`)."""
