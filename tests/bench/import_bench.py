"""Cold-start benchmark: `import function_app` versus importing every provider SDK eagerly.

Run: python -m tests.bench.import_bench  (each figure is the median of fresh interpreters)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

from shared.providers.registry import sdk_modules

ROOT = Path(__file__).resolve().parents[2]
SDKS = "import " + ", ".join(sdk_modules())
PROBE = ("import time, sys; t = time.perf_counter(); {stmt}; d = time.perf_counter() - t; "
         "print(d, ','.join(s for s in " + repr(sdk_modules()) + " if s in sys.modules))")


def measure(stmt: str, repeat: int = 5) -> tuple[float, str]:
    times, loaded = [], ""
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", PROBE.format(stmt=stmt)], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
        times.append(float(out[0]))
        loaded = out[1] if len(out) > 1 else ""
    return statistics.median(times), loaded


def main() -> None:
    app_t, app_loaded = measure("import function_app")
    eager_t, eager_loaded = measure(f"import function_app; {SDKS}")
    print(f"import function_app:                 {app_t * 1000:7.1f} ms  provider SDKs loaded: {app_loaded or 'none'}")
    print(f"import function_app + every SDK:     {eager_t * 1000:7.1f} ms  loaded: {eager_loaded}")
    print(f"ratio lazy / eager:                  {app_t / eager_t:7.3f}  (eager costs {eager_t / app_t:.1f}x)")


if __name__ == "__main__":
    main()
