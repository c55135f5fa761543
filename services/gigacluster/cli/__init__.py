"""The ``gigacluster`` command line."""
