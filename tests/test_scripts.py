"""The set-up scripts the README's test command runs (scripts/setup_browser.sh): the browser for the
browser tests is installed when the script can act as root, else it says what to run and fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup_browser.sh"


def _bin(tmp_path: Path, **scripts: str) -> Path:
    """A PATH holding only the tools the script may call: stubs given here, the real cat."""
    folder = tmp_path / "bin"
    folder.mkdir()
    os.symlink(shutil.which("cat"), folder / "cat")
    for name, body in scripts.items():
        path = folder / name.replace("_", "-")
        path.write_text(f"#!{shutil.which('bash')}\n{body}\n")
        path.chmod(0o755)
    return folder


def _run(path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": str(path), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([shutil.which("bash"), str(SCRIPT)], capture_output=True, text=True, env=env)


def test_without_root_it_says_what_to_run_and_fails(tmp_path):
    path = _bin(tmp_path, id="echo 1000", apt_get=f"echo called >> {tmp_path}/apt")
    proc = _run(path)
    assert proc.returncode == 1
    assert "sudo apt-get install -y chromium chromium-driver" in proc.stderr
    assert "CHEXPERCEPT_SKIP_BROWSER=1 bash scripts/test.sh" in proc.stderr
    assert not (tmp_path / "apt").exists()  # it never tried


def test_as_root_it_installs_chromium_and_its_driver(tmp_path):
    log = tmp_path / "apt.log"
    path = _bin(tmp_path, id="echo 0", apt_get=f'echo "$@" >> {log}')
    proc = _run(path)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].startswith("install -y") and calls[1].endswith("chromium chromium-driver")


def test_with_the_browser_on_path_it_does_nothing(tmp_path):
    path = _bin(tmp_path, id="echo 1000", chromium="true", chromedriver="true")
    proc = _run(path)
    assert proc.returncode == 0 and proc.stderr == ""
