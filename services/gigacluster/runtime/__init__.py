"""Shared runtime of the services: virtual clock, config, logging, telemetry, gRPC plumbing."""
