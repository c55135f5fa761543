"""Failures that strike the mesh: failure-rate tables, the seeded draw, and the injector that breaks chips and links.

* :mod:`faults.table` (pure): a failure-rate table (the Llama 3 mix, or a user's YAML), validated;
* :mod:`faults.draw` (pure): the seeded Poisson draw of failures over a mesh's chips and what each one
  breaks (a chip, a host's chips, a NIC cable, a transient software fault). The offline goodput model
  (``faults.goodput.simulate_goodput``) and the live injector draw from this one code;
* :mod:`faults.goodput` (pure): ``simulate_goodput``, the offline goodput of a job under the same draw;
* :mod:`faults.journal` (pure): the injector's durable progress (state file and action log);
* :mod:`faults.driver` (gRPC): the injector process (``gigacluster faults run``) that injects each drawn
  failure with ``ChipService.InjectFault`` / ``FabricService.InjectLinkFault`` at its virtual time and
  clears it when its repair is due;
* :mod:`faults.replay` (a tool): a training run with its failures through a live event-mode mesh next to
  the offline model (``examples/llama3_405b_failures.py``, ``benchmarks/bench_faults_run.py``).

Errors: a bad table is :class:`gigacluster.errors.InvalidArgument` naming the field (the package has no
error classes of its own).
"""
