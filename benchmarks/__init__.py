"""aiolock's benchmark harness (issue 5): ``python -m benchmarks``.

Layout: ``run`` is the command and the orchestrator; ``_worker`` runs one
scenario of one library in a worker process; ``_libs`` puts every library
behind one interface; ``_server`` starts the private redis-server;
``_analysis`` and ``_report`` turn raw results into RESULTS.md and plots.
The cluster section (issue 11): ``_cluster`` starts the local 3 + 3 clusters
and reads them as one admin view, ``_cluster_section`` runs its cells beside
standalone ones, ``_report_cluster`` writes its tables and targets.
"""
