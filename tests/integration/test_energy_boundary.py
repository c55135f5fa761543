"""The demo's cluster energy and a job's IT energy are on one boundary (chips plus host share, the same
window), so the whole cluster never reports less energy than one job running on part of it."""

from __future__ import annotations

import pytest

from gigacluster.cli.demo import chip_totals
from gigacluster.client import Client
from gigacluster.report import cluster_it_energy_j
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack
from tests.integration.test_mesh import demo_job, run_job

pytestmark = pytest.mark.integration


def test_cluster_it_energy_adds_every_devices_host_share() -> None:
    """Chip energy plus devices x host watts x window; a negative window adds nothing."""
    assert cluster_it_energy_j(1000.0, 4, 10.0, host_w_per_chip=50.0) == pytest.approx(3000.0)
    assert cluster_it_energy_j(1000.0, 4, -1.0, host_w_per_chip=50.0) == pytest.approx(1000.0)


async def test_cluster_energy_is_at_least_the_jobs_it_energy_on_a_run(stack: Stack, tenant: Client) -> None:
    """A 32-chip job on the 64-chip stack: the cluster's IT energy over the job's window (all shards, idle
    chips included, host share added) is at least the job's own IT energy, and more than its chips alone."""
    spec, job = demo_job(steps=4)
    before = await chip_totals(stack)
    final = (await run_job(tenant, spec, job))[-1].job
    after = await chip_totals(stack)
    assert final.state == scheduler_pb2.Job.STATE_SUCCEEDED, final.reason
    assert after.devices == 64
    window_s = after.now_s - before.now_s
    cluster_j = cluster_it_energy_j(after.energy_j - before.energy_j, after.devices, window_s)
    assert final.usage.energy_it_j > 0
    assert cluster_j >= final.usage.energy_it_j
    assert cluster_j > after.energy_j - before.energy_j
