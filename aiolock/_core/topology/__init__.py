"""Topology: how a Client reaches its servers (the deployments: standalone, Sentinel, Cluster), the
cluster's slot map and routing, the Sentinels' watch.
"""
