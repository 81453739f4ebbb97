"""The PostgreSQL engine (production and development)."""

from .engine import PostgresEngine

__all__ = ["PostgresEngine"]
