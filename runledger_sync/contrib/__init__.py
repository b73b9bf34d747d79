"""Integrations with web frameworks (Flask, Django); each uses only the public API."""
