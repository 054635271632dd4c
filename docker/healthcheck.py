"""Docker HEALTHCHECK of the worker: exit 0 if its /healthz answers 200, else 1.

The port is ``IOLSTREAM_METRICS__PORT`` (the same override the worker reads), default 9108.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main() -> int:
    url = f"http://127.0.0.1:{os.environ.get('IOLSTREAM_METRICS__PORT', '9108')}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except Exception as exc:  # refused, 503 (HTTPError), timeout
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
