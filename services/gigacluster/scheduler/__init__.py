"""The training job scheduler: queue, gang placement through the broker, steps through the mesh."""
