"""Waiting: how waiting tasks are woken (the one pub/sub listener, the signal lists, polling) and
parked locally.
"""
