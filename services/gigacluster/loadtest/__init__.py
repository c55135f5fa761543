"""Open-loop load generation against a running gigacluster: inference over gRPC and over the
OpenAI-compatible HTTP endpoint, and training-job submissions.

* :mod:`.scenario` parses a scenario YAML (streams, arrival processes, tenants, duration, SLO), read with
  the bounded :mod:`gigacluster.safeyaml` and refusing unknown keys by name;
* :mod:`.azure` reads the Azure LLM inference trace 2023 CSV and time- and rate-scales it;
* :mod:`.schedule` precomputes the whole arrival timeline (Poisson or trace replay) before the
  first send, so a slow response never delays a later send (no coordinated omission: latency is
  measured from the *intended* send time);
* :mod:`.drivers` issues one request of each kind and times it;
* :mod:`.runner` fires the timeline against a cluster and collects results;
* :mod:`.report` turns results into HDR percentiles (p50/p90/p99/p99.9), TPOT, SLO attainment and goodput,
  a table, JSON and a PNG.

Errors: a bad scenario or trace raises :class:`gigacluster.errors.InvalidArgument` naming the field
(and, for a trace, the line).
"""
