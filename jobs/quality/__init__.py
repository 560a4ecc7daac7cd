"""Checks on staged data: what to check, and the figures the staging write measures."""
