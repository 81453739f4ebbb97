"""``manage.py xjobs_soak``: the chaos self-test a project runs on its own database and settings
(docs/soak.md).

* ``jobs``: the soak's own job definitions, registered only by the soak and its workers;
* ``tables``: its ledger and effects tables, the only SQL of its own;
* ``workload``: the producers;
* ``chaos``: the worker processes and the faults done to them;
* ``observe``: samples of the live tables while it runs;
* ``invariants``: the checks over the tables once everything finished;
* ``run``: the run from start to clean-up.
"""
