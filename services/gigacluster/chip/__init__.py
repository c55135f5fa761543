"""The chip emulator: one process hosts a shard of devices of one chip type, state in arrays."""
