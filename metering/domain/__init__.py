"""The pure domain: limits, windows, buckets and decisions.

Nothing here imports SQLAlchemy or Celery, or reads the clock.
"""
