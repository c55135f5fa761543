"""The Nitro-like isolation broker: tenants, API keys, instances and capability tokens."""
