"""Holds: the life of a hold (leases, the watchdog that renews them, their verification after a
reset, the undo of a lost acquire, the eviction channels).
"""
