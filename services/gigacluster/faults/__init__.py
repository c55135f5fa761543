"""Failures that strike the mesh: failure-rate tables, the seeded draw, and the injector that breaks chips and links.

* :mod:`faults.table` (pure): a failure-rate table (the Llama 3 mix, or a user's YAML), validated;
* :mod:`faults.draw` (pure): the seeded Poisson draw of failures over a mesh's chips and what each one
  breaks (a chip, a host's chips, a NIC cable, a transient software fault). The offline goodput model
  (``faults.goodput.simulate_goodput``) and the live injector draw from this one code;
* :mod:`faults.driver` (gRPC): the injector process (``gigacluster faults run``) that injects each drawn
  failure with ``ChipService.InjectFault`` / ``FabricService.InjectLinkFault`` at its virtual time and
  clears it when its repair is due.

Errors: a bad table is :class:`gigacluster.errors.InvalidArgument` naming the field (the package has no
error classes of its own).
"""
