"""Transport: the connections to one server (the command lanes, the dialer, the acknowledged lane),
over the one module that touches redis-py's internals.
"""
