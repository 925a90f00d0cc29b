"""Observe: the counts of acquisitions and holds, and OpenTelemetry when installed.
"""
