"""Adapters of the api's ports: the ledger over HTTP, Celery task sending."""
