"""The event clock's coordinator: the mesh's virtual time in ``--clock event`` mode.

``core`` is the advance rule (pure); ``service`` the gRPC service (``python -m gigacluster.clock``,
started by the Stack in event mode); ``v1`` the generated stubs. Each service process's side is
``runtime/coordinator_client.py``.
"""
