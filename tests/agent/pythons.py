"""Run the site agent's unit tests (tests/agent) under every Python from 3.8 up found on this
machine, each in a bare virtual environment with only pytest, cryptography and aiosmtpd (the
local relay of the fallback tests; no Django), then once more on the oldest with the pre-3.35
SQLite path forced on.

    python tests/agent/pythons.py [--versions 3.8,3.13] [--venvs var/agent-pythons]

An interpreter is looked for as ``pythonX.Y`` on PATH and, when that is a pyenv shim for a
version not selected, in pyenv's versions directory. A missing one is skipped with a printed
note. Each venv is kept under ``--venvs`` and rebuilt only when the requirements change.
Exit status 0 when every run passed, 1 otherwise.
"""

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
REQUIREMENTS = ("pytest>=7.4,<10", "cryptography>=41", "aiosmtpd>=1.4.6,<2")
PARALLEL = 2  # interpreters tested at a time
PYTEST_ARGS = (
    "-c",
    str(REPO / "tests" / "agent" / "pythons.ini"),
    "--rootdir",
    str(REPO),
    # tests/conftest.py sets up Django; the agent's tests must not need it.
    "--confcutdir",
    str(REPO / "tests" / "agent"),
    "-q",
    str(REPO / "tests" / "agent"),
)


def works(executable, version):
    try:
        out = subprocess.run(
            [executable, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def find_interpreter(version):
    """The path of a working ``pythonX.Y``, or None."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    for root in filter(None, roots):
        candidates.extend(sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))))
    for candidate in candidates:
        if works(candidate, version):
            return candidate
    return None


def ensure_venv(interpreter, directory):
    """A venv at ``directory`` made by ``interpreter`` with REQUIREMENTS installed; its python."""
    python = directory / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    stamp = directory / (".requirements-" + hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:12])
    if stamp.exists() and python.exists():
        return python
    shutil.rmtree(directory, ignore_errors=True)
    subprocess.run([interpreter, "-m", "venv", str(directory)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS], check=True
    )
    stamp.touch()
    return python


def run_tests(python, label, **env):
    """The agent's tests on ``python``: (passed, what they printed, with a heading and a result line)."""
    started = time.monotonic()
    child_env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    # The standby tests call Litestream, a binary the bare venvs lack: lend them this one's.
    litestream = shutil.which("litestream") or shutil.which("litestream", path=os.path.dirname(sys.executable))
    if litestream and "OUTBOX_LITESTREAM" not in child_env:
        child_env["OUTBOX_LITESTREAM"] = litestream
    child_env.update(env)
    result = subprocess.run(
        [str(python), "-m", "pytest", *PYTEST_ARGS],
        cwd=str(REPO),
        env=child_env,
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    verdict = "passed" if result.returncode == 0 else "FAILED"
    output = f"== agent tests on {label}\n{result.stdout}   {label}: {verdict} in {time.monotonic() - started:.0f} s\n"
    return result.returncode == 0, output


def run_version(version, interpreter, venvs, oldest):
    """The tests under one interpreter (in a venv of its own), and for the oldest once more with
    the pre-3.35 SQLite path forced: [(label, passed, output)]."""
    python = ensure_venv(interpreter, Path(venvs) / f"py{version}")
    label = f"Python {version}"
    runs = [(label, *run_tests(python, f"{label} ({interpreter})"))]
    if version == oldest:
        label = f"Python {version}, SQLite pre-3.35 path forced (OUTBOX_AGENT_SQLITE_NO_RETURNING=1)"
        runs.append((label, *run_tests(python, label, OUTBOX_AGENT_SQLITE_NO_RETURNING="1")))
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated X.Y versions")
    parser.add_argument("--venvs", default=str(REPO / "var" / "agent-pythons"), help="where the venvs are kept")
    args = parser.parse_args(argv)

    found = {}
    for version in args.versions.split(","):
        interpreter = find_interpreter(version.strip())
        if interpreter is None:
            print(f"note: python{version} not found on this machine; its agent tests are skipped", flush=True)
        else:
            found[version.strip()] = interpreter
    if not found:
        print("note: no interpreter found; nothing was run")
        return 0

    # Two interpreters at a time: a run spends half its time waiting (the agent's timeouts and
    # back-offs), so two fit on a two-core machine in little more than the time of one.
    # Each run's output is printed whole, in version order.
    oldest = next(iter(found))
    results = {}
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = [pool.submit(run_version, v, i, args.venvs, oldest) for v, i in found.items()]
        for future in futures:
            for label, passed, output in future.result():
                print(output, end="", flush=True)
                results[label] = passed

    print("== summary")
    for label, passed in results.items():
        print(f"   {'ok    ' if passed else 'FAILED'} {label}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
