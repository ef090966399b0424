"""Tenants and API keys."""
