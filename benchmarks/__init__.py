"""aiolock's benchmark harness (issue 5): ``python -m benchmarks``.

Layout: ``run`` is the command and the orchestrator; ``_worker`` runs one
scenario of one library in a worker process; ``_libs`` puts every library
behind one interface; ``_server`` starts the private redis-server;
``_analysis`` and ``_report`` turn raw results into RESULTS.md and plots.
"""
