"""Failure-rate tables (validation, the Llama 3 mix), the seeded draw and the journal of the fault injector."""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest

from gigacluster.errors import FailedPrecondition, InvalidArgument
from gigacluster.faults.draw import draw, hits, target
from gigacluster.faults.goodput import Mesh, simulate_goodput
from gigacluster.faults.journal import Active, Journal, read_log
from gigacluster.faults.table import LLAMA3_COUNTS, llama3, load_table, parse_table
from gigacluster.scheduler.runner import device_runs

ROW = {"cause": "x", "component": "gpu", "rate_per_chip_hour": 0.1, "repair_s": 60}


def test_llama3_table_is_the_published_mix_and_rate() -> None:
    """Llama 3 paper Table 5: 419 unexpected interruptions in 54 days on 16,384 GPUs, 148 faulty GPU, 72 HBM3."""
    assert sum(n for n, _ in LLAMA3_COUNTS.values()) == 419
    t = llama3()
    assert t.rate_per_chip_s * 16_384 * 54 * 86_400 == pytest.approx(419)
    shares = dict(zip([r.cause for r in t.rows], t.shares(), strict=True))
    assert shares["faulty GPU"] == pytest.approx(148 / 419) and shares["GPU HBM3 memory"] == pytest.approx(72 / 419)
    assert {r.component for r in t.rows} == {"gpu", "hbm", "switch_cable", "nic", "host", "software"}


@pytest.mark.parametrize(("row", "field"), [
    ({k: v for k, v in ROW.items() if k != "rate_per_chip_hour"}, "failures[0].rate_per_chip_hour"),
    ({k: v for k, v in ROW.items() if k != "component"}, "failures[0].component"),
    ({k: v for k, v in ROW.items() if k != "repair_s"}, "failures[0].repair_s"),
    (ROW | {"rate_per_chip_hour": -1.0}, "failures[0].rate_per_chip_hour"),
    (ROW | {"rate_per_chip_hour": float("nan")}, "failures[0].rate_per_chip_hour"),
    (ROW | {"repair_s": -5}, "failures[0].repair_s"),
    (ROW | {"component": "flux_capacitor"}, "failures[0].component"),
    (ROW | {"colour": "red"}, "failures[0].colour"),
])
def test_a_bad_row_is_refused_naming_the_field(row: dict[str, object], field: str) -> None:
    """A missing field, a negative or non-finite rate, an unknown component or key: InvalidArgument naming it."""
    with pytest.raises(InvalidArgument) as ei:
        parse_table({"failures": [row]})
    assert ei.value.field == field and ei.value.code == "INVALID_ARGUMENT"


def test_unknown_component_lists_the_allowed_ones_and_quotes_a_short_prefix() -> None:
    """The error for an unknown component lists the components and quotes at most 40 characters of the input."""
    with pytest.raises(InvalidArgument) as ei:
        parse_table([ROW | {"component": "z" * 500}])
    msg = str(ei.value)
    assert "allowed: gpu, hbm, switch_cable, nic, host, software" in msg and "z" * 41 not in msg


def test_tables_load_by_name_or_file(tmp_path: pathlib.Path) -> None:
    """A built-in name, a YAML file, the repository's short table; an unknown name or missing file is refused."""
    assert load_table("llama3") == llama3()
    f = tmp_path / "t.yaml"
    f.write_text("failures:\n  - {component: nic, rate_per_chip_hour: 0.5, repair_s: 10}\n")
    t = load_table(str(f))
    assert t.rows[0].cause == "nic" and t.rate_per_chip_s == pytest.approx(0.5 / 3600)
    short = load_table(str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "failure-table-short.yaml"))
    assert len(short.rows) == 6
    with pytest.raises(InvalidArgument, match="allowed: llama3"):
        load_table("chaos")
    with pytest.raises(InvalidArgument) as ei:
        load_table(str(tmp_path / "missing.yaml"))
    assert ei.value.field == "table"


def test_the_draw_is_seeded_poisson_in_the_tables_proportions() -> None:
    """Same seed, same failures; the rate and the cause shares follow the table; every chip can be hit."""
    t = llama3().scaled(1000.0)
    a = [f for _, f in zip(range(5000), draw(t, n_chips=1024, seed=7), strict=False)]
    b = [f for _, f in zip(range(5000), draw(t, n_chips=1024, seed=7), strict=False)]
    assert a == b and [f.index for f in a] == list(range(5000))
    gaps = np.diff([0.0] + [f.t_s for f in a])
    assert gaps.mean() == pytest.approx(1 / (t.rate_per_chip_s * 1024), rel=0.05)
    assert sum(f.cause == "faulty GPU" for f in a) / len(a) == pytest.approx(148 / 419, abs=0.02)
    assert len({f.device for f in a}) > 900
    assert list(draw(t.scaled(0.0), n_chips=8, seed=0)) == []


def test_each_component_breaks_what_it_names() -> None:
    """gpu/hbm/software: the chip; host: its scale-up domain; nic/switch_cable: its NIC links."""
    f = next(draw(llama3(), n_chips=64, seed=0))
    for comp, want in (("gpu", (13,)), ("hbm", (13,)), ("software", (13,)), ("host", tuple(range(8, 16)))):
        tg = target(f.__class__(0, 1.0, "c", comp, 13, 60.0), 8)
        assert tg.devices == want and not tg.is_link
    assert target(f.__class__(0, 1.0, "c", "hbm", 13, 60.0), 8).chip_kind == "hbm"
    nic = target(f.__class__(0, 1.0, "c", "nic", 13, 60.0), 8)
    assert nic.is_link and nic.nic_of == 13
    assert hits(f.__class__(0, 1.0, "c", "host", 13, 60.0), 8, range(0, 9))
    assert not hits(f.__class__(0, 1.0, "c", "gpu", 13, 60.0), 8, range(0, 9))


def test_offline_goodput_counts_the_drawn_failures_that_strike_the_job() -> None:
    """simulate_goodput takes its failures from the injector's draw: with a negligible restart every drawn
    failure on the job's chips is one interruption, and time adds up to the wall."""
    t = llama3().scaled(2000.0)
    mesh = Mesh(mesh_chips=64, domain_size=8)
    wall = 20_000.0
    drawn = itertools.takewhile(lambda f: f.t_s < wall, draw(t, n_chips=64, seed=3))
    want = [f for f in drawn if hits(f, 8, range(32))]
    r = simulate_goodput(chips=32, wall_s=wall, step_s=1.0, checkpoint_interval_steps=10, checkpoint_pause_s=0.1,
                         checkpoint_write_s=1.0, restart_s=1e-6, table=t, seed=3, mesh=mesh)
    assert r.interruptions == len(want) > 5
    assert r.useful_s + r.lost_s + r.restart_s + r.checkpoint_pause_s == pytest.approx(wall)


def test_journal_survives_a_restart_and_refuses_another_run(tmp_path: pathlib.Path) -> None:
    """The injector's state reloads as saved (next index, faults awaiting repair); another seed is refused."""
    j = Journal.open(tmp_path, seed=1, table="llama3", scale=2.0)
    j.start_s, j.next_index = 5.0, 3
    j.active.append(Active(2, 99.0, "faulty GPU", "gpu", devices=[4]))
    j.save()
    j.log({"action": "inject", "index": 2})
    k = Journal.open(tmp_path, seed=1, table="llama3", scale=2.0)
    assert (k.start_s, k.next_index, k.active) == (5.0, 3, j.active)
    assert read_log(tmp_path) == [{"action": "inject", "index": 2}]
    with pytest.raises(FailedPrecondition, match="seed"):
        Journal.open(tmp_path, seed=2, table="llama3", scale=2.0)


def test_collective_groups_of_a_gang_with_a_hole_stay_inside_it() -> None:
    """Rank groups are sent as runs even in device ids (the fabric adds group_stride to device ids): a gang
    with a hole (8-15, 24-47) becomes two runs whose expansion is exactly the gang; a contiguous gang stays one."""
    assert [(r[0].tolist(), r[1], r[2]) for r in device_runs(np.arange(32), (0, 4, 8), 1, 8)] == \
        [(list(range(8)), 4, 8)]
    gang = np.r_[8:16, 24:48]
    runs = device_runs(gang, (0, 4, 8), 1, 8)
    expanded = sorted(int(d) for ranks, n, s in runs for k in range(n) for d in ranks + k * s)
    assert expanded == sorted(gang.tolist()) and len(runs) == 2


def test_the_injector_config_refuses_a_bad_table_naming_the_field(tmp_path: pathlib.Path) -> None:
    """FaultsConfig fails at load on an unknown table name (listing the built-in ones) or a bad row (naming it)."""
    from gigacluster.faults.driver import FaultsConfig
    from gigacluster.runtime.config import ConfigError, load
    with pytest.raises(ConfigError, match="allowed: llama3"):
        load(FaultsConfig, flags={"table": "chaos"}, env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("failures:\n  - {component: gpu, repair_s: 5}\n")
    with pytest.raises(ConfigError, match=r"failures\[0\]\.rate_per_chip_hour"):
        load(FaultsConfig, flags={"table": str(bad)}, env={})
    with pytest.raises(ConfigError, match="scale"):
        FaultsConfig(scale=-1.0)


def test_every_repair_time_comes_from_the_catalog_with_its_source_or_assumption() -> None:
    """The built-in table's repair times are the catalog's ``failures.repair_s``; each one has a source or a stated
    assumption, and the software one says it is a restart, not a repair (Llama 3 paper, Section 3.3.4)."""
    from gigacluster.faults.table import COMPONENTS, DEFAULT_REPAIR_S
    from gigacluster.hw.catalog import _raw

    sec = _raw()["failures"]
    assert set(sec["repair_s"]) == set(COMPONENTS) == set(DEFAULT_REPAIR_S)
    assert {r.component: r.repair_s for r in llama3().rows} == {c: float(v) for c, v in sec["repair_s"].items()}
    for comp in COMPONENTS:
        assert comp in sec.get("sources", {}) or comp in sec.get("assumptions", {}), comp
    assert "Llama 3" in sec["sources"]["software"] and "restarted" in sec["sources"]["software"]
    assert sec["assumptions"]["software"].startswith("not a repair")
