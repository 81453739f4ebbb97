"""The PostgreSQL engine's operations, one module per family, one class per module: each
class implements its family's methods of the seam (``engines/base.py``) on
:class:`~django_xjobs.engines.postgres.core.PostgresCore`, and ``engine.py`` composes them
into :class:`~django_xjobs.engines.postgres.engine.PostgresEngine`. No family imports
another; a family that needs another's operation calls it on ``self``, as the seam declares it.
"""
