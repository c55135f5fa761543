"""Multi-tenant scenarios: a capacity planner's day on a running gigacluster, in one YAML file.

``gigacluster scenario run FILE`` creates the file's tenants, submits their training jobs at their
virtual start times, deploys an inference fleet and replays the Azure LLM inference trace 2023
against it (through :mod:`gigacluster.loadtest`), injects chip and link faults at their times, and
reports per-tenant goodput, energy and cost, per-job slowdown against ``estimate train`` on an idle
cluster, per-tier link utilisation and the inference SLO goodput (docs/scenarios.md).

* :mod:`.spec` parses and validates a scenario file (bounded :mod:`gigacluster.safeyaml`, unknown keys
  refused by name, jobs larger than the site and invalid tenant names refused before anything is sent);
* :mod:`.report` turns what the run observed into the report (JSON and markdown), pure;
* :mod:`.runner` drives a running stack through its public gRPC APIs.

Errors: a bad file raises :class:`gigacluster.errors.InvalidArgument` naming the field; a stack that does
not match the file (chip type, size, clock rate) raises :class:`gigacluster.errors.FailedPrecondition`.
"""
