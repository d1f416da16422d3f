"""Time `python -m pjrt_host list` with three plugins installed against
`python -c "import jax"` in the same run, and print the ratio.

Three plugins: the installed cpu_ref plus two generated distributions on a
temporary site directory (one with a real shared library exporting
GetPjrtApi, built with the C compiler when there is one).

    python benchmarks/bench_list.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLUGIN = """from pjrt_host import DevicePlugin

class Plugin(DevicePlugin):
    priority = {priority}

    def library_path(self):
        return {library!r}
"""


def make_site(root: Path) -> Path:
    site = root / "site"
    site.mkdir()
    library = None
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        src = root / "api.c"
        src.write_text("void* GetPjrtApi(void) { return 0; }\n")
        library = str(root / "libbench_pjrt.so")
        subprocess.run([cc, "-shared", "-fPIC", "-o", library, str(src)], check=True)
    for i, lib in enumerate([library, None]):
        name = f"bench_plugin_{i}"
        (site / f"{name}.py").write_text(PLUGIN.format(priority=10 + i, library=lib))
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[torch_xla.plugins]\nbench{i} = {name}:Plugin\n")
    return site


def time_command(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        site = make_site(Path(tmp))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
        env.pop("PJRT_DEVICE", None)
        listing = subprocess.run([sys.executable, "-m", "pjrt_host", "list"], env=env, capture_output=True, text=True)
        print(listing.stdout)
        rows = len(listing.stdout.strip().splitlines()) - 1
        # Interleave so that machine noise hits both alike.
        lst, jax_, bare = [], [], []
        for _ in range(args.runs):
            lst += time_command([sys.executable, "-m", "pjrt_host", "list"], env, 1)
            jax_ += time_command([sys.executable, "-c", "import jax"], env, 1)
            bare += time_command([sys.executable, "-c", "pass"], env, 1)
    m_list, m_jax, m_bare = (statistics.median(x) for x in (lst, jax_, bare))
    print(f"plugins listed:                {rows}")
    print(f"python -c pass         median: {m_bare * 1000:7.1f} ms")
    print(f"python -m pjrt_host list median: {m_list * 1000:7.1f} ms")
    print(f"python -c 'import jax' median: {m_jax * 1000:7.1f} ms")
    print(f"ratio list / import jax:       {m_list / m_jax:7.3f}")
    print(f"list under 0.5 s:              {'yes' if m_list < 0.5 else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
