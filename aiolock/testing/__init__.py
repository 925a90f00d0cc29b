"""Testing aids.

``aiolock.testing.seam``: what aiolock's own tests may observe of a Client
beyond its public API (instead of reaching into ``client._engine``); no
stability is promised beyond this repository's tests. This package is also
where the pytest plugin of DESIGN.md's public names will live
(``pytest_plugins = ["aiolock.testing"]``), so the seam has a module of its own.
"""
