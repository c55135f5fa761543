"""The wire layer: proto <-> domain conversion, one module per service's messages.

Every ``*_pb2`` message a service or a client of it builds or reads from a domain value goes
through its module here, so a domain package never sees a proto and a proto never reaches a
domain package:

    chip     Work <-> chip.v1 WorkItem (the work items the scheduler and router send to shards)
    fabric   collective ops and traffic classes <-> enums; flows, links, tiers, topology -> messages
    broker   tenants, instances, shards, device sets, Authenticate's answer, verification keys

The shared common.v1 pieces (precision, device ranges, paging) stay in :mod:`gigacluster.runtime.convert`,
and runtime.auth.BrokerAuth (the broker client every service uses, one layer down) reads its two
answers straight from the broker stubs.
This layer sits between the services and runtime (docs/architecture.md "Layers"); the generated
``*/v1`` stubs it imports are the wire contract every layer above the domain may use.
"""
