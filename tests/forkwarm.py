"""Imported by the fork server of tests/forkrun.py alone: what every forked run would
otherwise work out again, done once before the server forks.

The store backends' entry points (``store.registry``): reading them scans the metadata of
every installed distribution, in each process that opens a store.
"""

from store import registry

registry._load_entry_points()
