"""The README's test command installs everything the tests need, and .ci/run runs exactly that command."""

from __future__ import annotations

import pathlib
import re

from tests.ops.buftool import BUF_VERSION, NODE_CLIENT_PACKAGES, NODE_CLIENT_PREFIX, NPM_PREFIX

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _test_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("**2. Run the tests**", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).strip().splitlines()


def test_readme_test_command_installs_what_the_tests_drive_where_they_look() -> None:
    """The README's test command runs the installer, which pins buf and the Node gRPC packages in the prefixes the
    tests search and installs Mosquitto, its clients and Prometheus."""
    assert _test_block() == ["bash tests/install-deps.sh && python -m pytest"]
    script = (ROOT / "tests" / "install-deps.sh").read_text()
    assert f"BUF_VERSION={BUF_VERSION}" in script
    assert 'BUF_DIR="${BUF_DIR:-/tmp/gigacluster-buf-$BUF_VERSION}"' in script
    assert str(NPM_PREFIX) == f"/tmp/gigacluster-buf-{BUF_VERSION}"
    assert f"NODE_CLIENT_DIR={NODE_CLIENT_PREFIX}" in script
    assert f"NODE_CLIENT_PACKAGES=({' '.join(NODE_CLIENT_PACKAGES)})" in script
    for pkg in ("mosquitto", "mosquitto-clients", "prometheus", "npm"):
        assert f"missing+=({pkg})" in script


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """.ci/run's test step is the README's test command, letter for letter, and its buf is the installer's."""
    ci = (ROOT / ".ci" / "run").read_text()
    step = ci.split('echo "== tests (the README\'s test command)"', 1)[1].strip().splitlines()[0]
    assert step == _test_block()[0]
    assert f'BUF_BIN="{NPM_PREFIX}/node_modules/.bin/buf"' in ci
