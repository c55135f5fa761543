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


def test_readme_test_command_installs_mosquitto_and_buf_where_the_tests_look() -> None:
    """The README installs Mosquitto, buf and the Node gRPC packages (pinned, in the prefixes the tests search)."""
    install = " ".join(_test_block()[:-1])
    assert "apt-get install -y mosquitto npm" in install
    assert f"npm install --prefix {NPM_PREFIX} @bufbuild/buf@{BUF_VERSION}" in install
    assert f"npm install --prefix {NODE_CLIENT_PREFIX} {' '.join(NODE_CLIENT_PACKAGES)}" in install


def test_ci_runs_exactly_the_readme_test_command_with_buf_in_the_same_place() -> None:
    """.ci/run's test step is the README's last line, and it installs buf at the same version and prefix."""
    ci = (ROOT / ".ci" / "run").read_text()
    readme_cmd = _test_block()[-1]
    assert readme_cmd == "python -m pytest"
    step = ci.split('echo "== tests (the README\'s test command)"', 1)[1].strip().splitlines()[0]
    assert step == readme_cmd
    assert f"BUF_VERSION={BUF_VERSION}" in ci
    assert 'BUF_DIR="${BUF_DIR:-/tmp/gigacluster-buf-$BUF_VERSION}"' in ci
    assert f"NODE_CLIENT_DIR={NODE_CLIENT_PREFIX}" in ci and " ".join(NODE_CLIENT_PACKAGES) in ci
