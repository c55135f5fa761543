"""Whole-site presets and the scale-out tree a cluster size needs (sites.py, ``up --preset``)."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from gigacluster import sites
from gigacluster.cli.up import SITE_DEFAULTS, add_stack_args, site_settings, stack_config
from gigacluster.fabric.sizing import Scaleout, choose_scaleout
from gigacluster.hw import catalog
from gigacluster.model import SpecError
from gigacluster.planning import chips_fed, provisioned_power_w
from gigacluster.runtime.config import ConfigError, FabricConfig


def test_the_smallest_tree_that_holds_the_chips_is_chosen() -> None:
    """64 H100 fit two tiers of Tomahawk 5; 131k Trainium3 (200 Gb/s, 256 ports) need three; a million
    H100 at 400 Gb/s (128 Tomahawk 5 ports, 128 pods at most) need Tomahawk 6."""
    assert choose_scaleout("h100-sxm", 64) == Scaleout(2, "tomahawk5")
    assert choose_scaleout("trainium3", 131072) == Scaleout(3, "tomahawk5")
    assert choose_scaleout("h100-sxm", 1 << 20) == Scaleout(3, "tomahawk6")


def test_flags_given_explicitly_are_kept_and_a_size_no_tree_holds_is_refused_with_what_was_tried() -> None:
    """An explicit switch too small for the size is INVALID_ARGUMENT naming the field and the trees tried."""
    assert choose_scaleout("h100-sxm", 64, tiers=3) == Scaleout(3, "tomahawk5")
    with pytest.raises(SpecError) as err:
        choose_scaleout("h100-sxm", 1 << 20, switch="tomahawk5")
    assert err.value.field == "count" and "3 tiers of tomahawk5" in err.value.message
    with pytest.raises(SpecError, match="allowed: tomahawk-ultra, tomahawk5, tomahawk6"):
        choose_scaleout("h100-sxm", 64, switch="tomahawk9")
    with pytest.raises(SpecError, match="tiers"):
        choose_scaleout("h100-sxm", 64, tiers=4)


@pytest.mark.parametrize("name", sorted(sites.PRESETS))
def test_a_preset_is_what_its_power_feeds_in_whole_domains_per_shard(name: str) -> None:
    """The chips are ``plan --power-mw``'s count rounded down to whole scale-up domains in every shard (less
    than one domain per shard lost), and the tree chosen holds them."""
    p = sites.get_preset(name)
    site = p.resolve()
    unit = p.domain() * p.shards
    fed = chips_fed(p.power_mw, p.chip)
    assert site["chips"] % unit == 0 and fed - unit < site["chips"] <= fed
    assert p.shards >= 16 and site["tiers"] == 3 and site["routing"] == "spray"
    assert choose_scaleout(p.chip, site["chips"], nic=p.nic) == Scaleout(3, site["switch"], p.nic)


def test_2gw_of_trainium3_is_1_6_million_chips() -> None:
    """2,000 MW / (Trainium3 TDP + host share) / PUE 1.1 (the catalog's facility default): 1,623,376 chips,
    1,623,040 in 16 shards of whole 64-chip UltraServers."""
    per_chip = provisioned_power_w("trainium3") * catalog.facility().pue_default
    assert chips_fed(2000.0, "trainium3") == int(2000e6 // per_chip) == 1_623_376
    assert sites.get_preset("2gw-trainium3").resolve()["chips"] == 1_623_040


def test_unknown_preset_lists_the_allowed_ones() -> None:
    """A misspelt preset names every preset there is."""
    with pytest.raises(SpecError, match="allowed: 2gw-trainium3, 2gw-mi355x, 2gw-b200"):
        sites.get_preset("2gw-tpu")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_stack_args(p)
    return p.parse_args(list(argv))


def test_up_flags_win_over_the_preset_which_wins_over_the_defaults() -> None:
    """``up`` with no flag is the 64-chip H100 stack; a preset fills every site field; a flag beside it wins."""
    assert site_settings(_args()) == SITE_DEFAULTS
    site = site_settings(_args("--preset", "2gw-b200"))
    assert site["chip"] == "b200" and site["chips"] == 1_623_296 and site["switch"] == "tomahawk6"
    site = site_settings(_args("--preset", "2gw-b200", "--chips", "1024", "--shards", "2", "--tiers", "2"))
    assert (site["chip"], site["chips"], site["shards"], site["tiers"]) == ("b200", 1024, 2, 2)


def test_a_tree_too_small_is_refused_before_anything_starts() -> None:
    """``up`` with an explicit switch that cannot hold the chips exits with the reason before starting a
    process; the fabric's own config refuses a tier count other than 2, 3 or 0 (chosen from the size)."""
    with pytest.raises(SystemExit, match="more than a three-tier tomahawk5 tree holds"):
        stack_config(_args("--chips", str(1 << 20), "--switch", "tomahawk5"), state=pathlib.Path("/nonexistent"))
    with pytest.raises(ConfigError, match="tiers must be 2, 3 or 0"):
        FabricConfig(chip="h100-sxm", count=64, tiers=4)
    assert FabricConfig(chip="h100-sxm", count=64).tiers == 0
    with pytest.raises(ConfigError, match="backdate_s must be a finite number > 0"):
        FabricConfig(chip="h100-sxm", count=64, backdate_s=0.0)


def test_oversubscription_is_an_up_flag_and_a_bad_one_is_refused_before_anything_starts() -> None:
    """``up --oversubscription 63`` reaches the stack config (no hidden environment variable needed); a ratio
    outside [1, 64] exits with the allowed range before any process starts."""
    cfg = stack_config(_args("--chips", "32", "--oversubscription", "63"), state=pathlib.Path("/nonexistent"))
    assert cfg.oversubscription == 63.0
    assert stack_config(_args(), state=pathlib.Path("/nonexistent")).oversubscription == 0.0  # the fabric's default
    with pytest.raises(SystemExit, match=r"oversubscription.*\[1, 64\]"):
        stack_config(_args("--oversubscription", "0.5"), state=pathlib.Path("/nonexistent"))


def test_up_deploys_the_default_model_or_the_one_given_with_its_tp_ep_and_precision() -> None:
    """``up`` with no model flag deploys llama3-8b (TP 1, 2 replicas) as before; ``--model gpt-oss-120b
    --model-ep 4 --model-precision mxfp4`` deploys that MoE expert-parallel in MXFP4; an unknown precision exits
    with the allowed list before anything is sent."""
    from gigacluster.cli.up import model_request
    from gigacluster.common.v1 import common_pb2
    from gigacluster.runtime.convert import PRECISION_ENUMS

    p = argparse.ArgumentParser()
    from gigacluster.cli import up as up_cli
    sub = p.add_subparsers()
    up_cli.register(sub)
    req = model_request("h100-sxm", p.parse_args(["up"]))
    assert (req.deployment_id, req.model.preset, req.tp, req.ep, req.replicas) == ("llama3-8b", "llama3-8b", 1, 0, 2)
    assert req.precision == common_pb2.PRECISION_UNSPECIFIED
    req = model_request("b200", p.parse_args(["up", "--model", "gpt-oss-120b", "--model-ep", "4",
                                              "--model-precision", "mxfp4"]))
    assert (req.model.preset, req.chip, req.ep, req.precision) == ("gpt-oss-120b", "b200", 4, PRECISION_ENUMS["mxfp4"])
    with pytest.raises(SystemExit, match="allowed bf16, fp16"):
        model_request("b200", p.parse_args(["up", "--model-precision", "fp3"]))
